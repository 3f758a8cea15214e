"""Consumption retries through the broker (RocketMQ's retry topic and dead-letter queue).

A push consumer in CLUSTERING mode gives a message it failed to consume back to the broker with
CONSUMER_SEND_MSG_BACK (36); the broker puts a copy on ``%RETRY%<group>`` to be delivered again
after the retry ladder's delay (10s 30s 1m 2m … 2h), or in ``%DLQ%<group>`` once it was
reconsumed ``max_reconsume_times`` times::

    orders ──pull──▶ listener ─RECONSUME_LATER─▶ SEND_MSG_BACK(offset, group) ──▶ broker
                                                                                   │ copy, DELAY 3 + n
       listener ◀── topic = RETRY_TOPIC ◀──pull── %RETRY%<group> ◀─────────────────┘ (or %DLQ%<group>)

Every member subscribes to its group's retry topic; a message read from it gets its original
topic back (the ``RETRY_TOPIC`` property), so listeners see the topic they subscribed to, with
``reconsume_times`` as the broker counted it. ``ORIGIN_MESSAGE_ID`` names the first stored copy.
These are the pure parts: names, the request, the topic restore (no sockets).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from sdk.message import MessageExt

RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX: Final = "%DLQ%"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
DEFAULT_MAX_RECONSUME_TIMES: Final = 16  # a concurrent listener's, when the option is -1
DELAY_LEVEL_BY_BROKER: Final = 0  # the broker picks 3 + reconsume times
DELAY_LEVEL_DLQ: Final = -1  # straight to the dead-letter queue


def retry_topic(group: str) -> str:
    """``%RETRY%<group>`` (with tenancy the group is ``tenant%name``: ``%RETRY%tenant%name``)."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def send_back_request(
    msg: MessageExt, group: str, *, delay_level: int = DELAY_LEVEL_BY_BROKER, max_reconsume_times: int
) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK (36) for ``msg`` as it was delivered (its CommitLog offset)."""
    return RemotingCommand(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        ext_fields={
            "offset": str(msg.commit_log_offset),
            "group": group,
            "delayLevel": str(delay_level),
            "originMsgId": msg.msg_id,
            "originTopic": msg.topic,
            "unitMode": "false",
            "maxReconsumeTimes": str(max_reconsume_times),
        },
    )


def restore_retry_topics(msgs: Iterable[MessageExt], group_retry_topic: str) -> None:
    """Messages read from the group's retry topic get their original topic back (RocketMQ's
    resetRetryAndNamespace): the listener sees the topic it subscribed to."""
    for m in msgs:
        if m.topic == group_retry_topic:
            original = m.properties.get(PROPERTY_RETRY_TOPIC)
            if original:
                m.topic = original


# --- dead-letter queues (AdminClient, ``orbit dlq``) ------------------------------------------------
# Properties of a parked copy that must not travel with a re-sent one: the delay (and where the
# schedule service was to put it), the broker's send hints, retry bookkeeping of the old life.
_NOT_RESENT: Final = frozenset(
    {"DELAY", "REAL_TOPIC", "REAL_QID", "WAIT", "TRAN_MSG", "PGROUP", "RECONSUME_TIME", "MAX_RECONSUME_TIMES",
     "CONSUME_START_TIME", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "__STARTDELIVERTIME",
     "TIMER_OUT_MS", "REPUT_FROM"}
)  # fmt: skip


def original_topic(properties: dict[str, str], fallback: str) -> str:
    """The topic a retried or parked message was first sent to (RETRY_TOPIC)."""
    return properties.get(PROPERTY_RETRY_TOPIC) or fallback


def resend_properties(properties: dict[str, str], *, dlq_msg_id: str) -> dict[str, str]:
    """The properties of a dead-lettered message sent again: its own (tags, keys, UNIQ_KEY, the
    user's), RETRY_TOPIC and ORIGIN_MESSAGE_ID kept (set from the parked copy when missing),
    nothing of the old delay or retry bookkeeping."""
    out = {k: v for k, v in properties.items() if k not in _NOT_RESENT}
    out.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, dlq_msg_id)
    return out


def matches_id(msg_id: str, *, unique_id: str | None, offset_msg_id: str, origin_msg_id: str | None) -> bool:
    """Whether ``msg_id`` names a message: its producer id (UNIQ_KEY), the stored copy's offset
    id, or its ORIGIN_MESSAGE_ID (case-insensitive: offset ids are hex)."""
    want = msg_id.upper()
    return any(v is not None and v.upper() == want for v in (unique_id, offset_msg_id, origin_msg_id))
