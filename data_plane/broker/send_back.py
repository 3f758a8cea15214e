"""CONSUMER_SEND_MSG_BACK (36): a consumer gives back a message it failed to consume, and the
broker schedules it again on the group's retry topic or parks it in the group's dead-letter queue.

Request ext (RocketMQ's ConsumerSendMsgBackRequestHeader): ``offset`` (the CommitLog offset of
the message as it was delivered), ``group``, ``delayLevel``, ``originMsgId``, ``originTopic``,
``unitMode``, ``maxReconsumeTimes``. The broker reads the record at ``offset`` and puts a copy::

    record at offset ─┬─▶ %RETRY%<group>  queue 0   DELAY = delayLevel > 0 ? delayLevel : 3 + reconsumeTimes
                      └─▶ %DLQ%<group>    queue 0   when reconsumeTimes >= max, or delayLevel < 0

    copy.reconsumeTimes     = record.reconsumeTimes + 1      (the broker's count, not the client's)
    copy.RETRY_TOPIC        = record's RETRY_TOPIC, else record.topic   (the topic subscribed to)
    copy.ORIGIN_MESSAGE_ID  = record's ORIGIN_MESSAGE_ID, else the record's offset message id
    copy.body, flag, born timestamp, other properties (TAGS, KEYS, UNIQ_KEY, user's) = the record's

``max`` is the header's ``maxReconsumeTimes`` when it is there and >= 0 (RocketMQ clients send
theirs, 16 by default), else the group's ``retryMaxTimes`` (subscriptionGroup.json, 16). Delay
level 3 is the ladder's 10 s step: 10s 30s 1m 2m … 2h for retries 1 … 16 (the schedule service's
``message_delay_level``). Both topics are created on demand with one queue: the retry topic
read-write, the DLQ read-write too (RocketMQ makes it write-only; Orbit lets the group's
principal and ``orbit dlq`` read it). With tenancy a group ``acme%g`` gets ``%RETRY%acme%g`` and
``%DLQ%acme%g``, and the record at ``offset``, not the header, decides what a send-back needs: a
record of the group's own tenant, an ``originTopic`` (when given) that is the record's topic or
its origin (``origin_topic``: a retry or DLQ record's RETRY_TOPIC), and the sender's subscribe
on both — else NO_PERMISSION, logged and counted (``BrokerTenancy.refuse``). An offset thus
copies into the group's retry topic only a message the sender could have pulled itself.

The copy goes through the broker's registered SEND_MESSAGE handler, so everything a send does
applies to it: the delay service's DELAY handling, SYNC_FLUSH durability before the answer, the
tenant's publish quota, waking pulls held on the retry queue, metrics. The copy's born host is
the consumer's address (the connection that sent it back).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Final

from data_plane.auth.request_access import SUBSCRIBE
from data_plane.broker.topic_config import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from data_plane.broker.trace import DEAD_LETTERED, RETRIED
from data_plane.remoting.codes import PERM_READ_WRITE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.headers import field_int, field_str
from data_plane.store.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT_STORE_MSG_OK,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
    encode_properties,
)
from data_plane.store.message_store import COLD_FETCH_TRIES
from data_plane.store.tier.object_store import ObjectStoreError
from data_plane.tenancy.namespace import tenant_of

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from data_plane.broker.broker import Broker
    from data_plane.broker.tenancy import BrokerTenancy

# RocketMQ's MessageConst names.
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"

# (message id, event, fields) for the message trace, recorded once the copy is stored.
TraceEvent = tuple[str, str, dict[str, Any]]

FIRST_RETRY_DELAY_LEVEL: Final = 3  # 10 s on RocketMQ's ladder "1s 5s 10s 30s 1m ..."
MAX_DELAY_LEVEL: Final = 18  # the ladder has 18 levels; retries past it stay on the last
DEFAULT_MAX_RECONSUME_TIMES: Final = 16

# The send path's answers that mean "stored" (perhaps not as durable as asked).
_STORED: Final = frozenset(
    {ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
     ResponseCode.SLAVE_NOT_AVAILABLE}
)  # fmt: skip


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def retry_delay_level(reconsume_times: int, requested: int = 0) -> int:
    """The delay level of the ``reconsume_times``-th retry (0-based): the client's level when it
    asked for one, else 3 + reconsume_times, capped at the ladder's last level."""
    level = requested if requested > 0 else FIRST_RETRY_DELAY_LEVEL + reconsume_times
    return min(level, MAX_DELAY_LEVEL)


def goes_to_dlq(reconsume_times: int, max_reconsume_times: int, requested_level: int) -> bool:
    """RocketMQ's rule: out of retries, or the client asked for the DLQ (delay level < 0)."""
    return requested_level < 0 or reconsume_times >= max_reconsume_times


def copy_properties(rec: StoredMessage, *, delay_level: int | None) -> dict[str, str]:
    """The properties of the copy of ``rec`` that is sent back (``delay_level`` None: to the DLQ)."""
    props = dict(rec.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, rec.topic)
    if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
        props[PROPERTY_ORIGIN_MESSAGE_ID] = rec.msg_id
    for stale in (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TRANSACTION_PREPARED, PROPERTY_WAIT_STORE_MSG_OK):
        props.pop(stale, None)
    if delay_level is not None:
        props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
    return props


def origin_topic(rec: StoredMessage) -> str:
    """The topic a consumer of ``rec`` subscribed to: for a record on a retry or dead-letter topic
    its ``RETRY_TOPIC`` (the topic the message was first sent to) when set, else its own topic.
    A ``RETRY_TOPIC`` on a record of any other topic is the sender's and says nothing."""
    if rec.topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
        return rec.properties.get(PROPERTY_RETRY_TOPIC) or rec.topic
    return rec.topic


def _shown(name: str) -> str:
    """A name read from a record or a header, quoted and cut for a remark or a log line (one line)."""
    return repr(name[:255])


class SendBackProcessor:
    __slots__ = ("broker",)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def _send_back_tiered(self, conn: Connection, cmd: RemotingCommand, offset: int) -> RemotingCommand:
        store = self.broker.store
        try:
            for _ in range(COLD_FETCH_TRIES):  # (again when other readers evicted it meanwhile)
                await store.fetch_cold(offset)
                if not store.cold(offset):
                    break
        except ObjectStoreError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"the tiered message cannot be read now: {e}")
        if store.cold(offset):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        answer = self.send_back(conn, cmd)
        return await answer if inspect.isawaitable(answer) else answer

    def send_back(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        offset = field_int(ext, "offset", lo=0)
        group = field_str(ext, "group", max_length=1024)
        requested_level = field_int(ext, "delayLevel", 0, lo=-(2**31), hi=2**31 - 1)
        header_max = field_int(ext, "maxReconsumeTimes", -1, lo=-(2**31), hi=2**31 - 1)
        broker = self.broker
        if not broker.writable:
            return cmd.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, f"broker {broker.address} is a slave: send back to the master"
            )
        g = broker.groups.find(group)
        if g is None:
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        rec = broker.store.look_message_by_offset(offset)
        if rec is None and broker.store.cold(offset):  # tiered, not in memory: fetch it, then go on
            return self._send_back_tiered(conn, cmd, offset)
        if rec is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        tenancy = broker.tenancy
        if tenancy is not None and tenancy.enabled:
            refused = self._refused(conn, cmd, tenancy, rec, offset, group)
            if refused is not None:
                return refused
        max_times = header_max if header_max >= 0 else int(g.get("retryMaxTimes", DEFAULT_MAX_RECONSUME_TIMES))
        to_dlq = goes_to_dlq(rec.reconsume_times, max_times, requested_level)
        if to_dlq:
            topic = dlq_topic(group)
            props = copy_properties(rec, delay_level=None)
        else:
            topic = retry_topic(group)
            props = copy_properties(rec, delay_level=retry_delay_level(rec.reconsume_times, requested_level))
        if broker.config.auth_enabled and tenant_of(props[PROPERTY_RETRY_TOPIC]) != tenant_of(group):
            # RETRY_TOPIC came from the sender: another tenant's topic would put this group's event
            # into that tenant's message trace.
            props[PROPERTY_RETRY_TOPIC] = rec.topic
        event: TraceEvent | None = None
        if broker.trace is not None:  # the message's trace: retried / dead-lettered by this group
            event = (
                rec.msg_id,
                DEAD_LETTERED if to_dlq else RETRIED,
                {
                    "group": group,
                    "topic": props.get(PROPERTY_RETRY_TOPIC, rec.topic),
                    ("dlqTopic" if to_dlq else "retryTopic"): topic,
                    "reconsumeTimes": rec.reconsume_times + 1,
                    "clientAddr": conn.peer,
                },
            )
        try:
            self._ensure_topic(topic)
        except ValueError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        put = RemotingCommand(
            RequestCode.SEND_MESSAGE,
            ext_fields={
                "producerGroup": group,
                "topic": topic,
                "defaultTopic": topic,
                "defaultTopicQueueNums": "1",
                "queueId": "0",
                "sysFlag": str(rec.sys_flag & ~TRANSACTION_TYPE_MASK),
                "bornTimestamp": str(rec.born_timestamp),
                "flag": str(rec.flag),
                "properties": encode_properties(props).decode(),
                "reconsumeTimes": str(rec.reconsume_times + 1),
            },
            body=rec.body,
        )
        handler = broker.processors.handlers.get(RequestCode.SEND_MESSAGE)
        if handler is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "the broker's send path is not registered")
        answer = handler(conn, put)
        if answer is None or isinstance(answer, RemotingCommand):
            return self._answer(cmd, answer, event)
        return self._answer_later(cmd, answer, event)

    def _refused(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        tenancy: BrokerTenancy,
        rec: StoredMessage,
        offset: int,
        group: str,
    ) -> RemotingCommand | None:
        """With authentication on, the record at ``offset`` decides what the send-back needs, not
        the header: the record must be in the group's tenant; a given ``originTopic`` must be
        the record's topic or its origin (``origin_topic``); and the principal must hold
        subscribe on both (a retry or dead-letter topic is the group's subscribe). A refusal is
        NO_PERMISSION, logged and counted by ``tenancy.refuse``; its remark does not name the
        record's topic."""
        origin = origin_topic(rec)
        what = (
            f"send-back to group {_shown(group)} of the message at offset {offset} "
            f"(on {_shown(rec.topic)}, origin {_shown(origin)})"
        )
        if tenant_of(rec.topic) != tenant_of(group):
            remark = f"the message at offset {offset} is not in group {group}'s namespace"
            return tenancy.refuse(conn, cmd, remark, f"{what}: outside the group's namespace")
        given = (cmd.ext_fields or {}).get("originTopic") or ""
        if given and given not in (rec.topic, origin):
            remark = f"originTopic {_shown(given)} is not the topic of the message at offset {offset}"
            return tenancy.refuse(conn, cmd, remark, f"{what}: originTopic {_shown(given)} does not match it")
        denial = tenancy.stored_topics_denial(cmd, dict.fromkeys((rec.topic, origin)), SUBSCRIBE)
        if denial is not None:
            remark = f"the message at offset {offset} is on a topic this credential may not subscribe to"
            return tenancy.refuse(conn, cmd, remark, f"{what}: {denial}")
        return None

    def _ensure_topic(self, topic: str) -> None:
        topics = self.broker.topics
        if topics.get(topic) is None:
            topics.create_or_update(topic, read_queue_nums=1, write_queue_nums=1, perm=PERM_READ_WRITE)
            self.broker.topics_changed()

    async def _answer_later(
        self, cmd: RemotingCommand, pending: Awaitable[RemotingCommand | None], event: TraceEvent | None
    ) -> RemotingCommand:
        return self._answer(cmd, await pending, event)

    def _answer(self, cmd: RemotingCommand, put: RemotingCommand | None, event: TraceEvent | None) -> RemotingCommand:
        if put is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "the send path gave no answer")
        if put.code in _STORED:
            trace = self.broker.trace
            if event is not None and trace is not None:
                trace.record(event[0], event[1], **event[2])
            return cmd.response(ResponseCode.SUCCESS)
        return cmd.response(put.code, put.remark)
