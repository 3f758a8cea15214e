"""ConsumerFilterManager: SQL92 subscriptions on the broker (RocketMQ's ``ConsumerFilterManager``
and ``ExpressionMessageFilter`` for ``ExpressionType.SQL92``).

    CHECK_CLIENT_CONFIG (46) ─┐
    HEART_BEAT (34)          ─┼─▶ check(type, expression) ─▶ None | "SQL92 expression error at position n: …"
    PULL_MESSAGE (11) ────────┘      └─ compiled once per (group, topic, expression): PredicateCache
        └─ expressionType SQL92 ─▶ pull_filtered ─▶ MessageStore.get_message(record_filter=pred.matches_record)

A TAG pull never comes here: ``PullProcessor.pull`` hands a request over only when its
``expressionType`` is not TAG, so unfiltered consumers keep the path they had. A filtered pull
reads the ConsumeQueue like any pull, then decodes each candidate record's properties from the
CommitLog and keeps those the predicate says TRUE to. When nothing in the scanned window matches,
the answer is PULL_RETRY_IMMEDIATELY with ``nextBeginOffset`` past the window (RocketMQ's
NO_MATCHED_MESSAGE), so a selective filter still moves through the queue; at the queue's end the
pull is held like any other and re-read when a message arrives.

With ``enable_property_filter = false`` (RocketMQ's ``enablePropertyFilter``) SQL92 subscriptions
are refused with the reason, as RocketMQ does.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from data_plane.filter.sql92 import EXPRESSION_TYPE_SQL92, PredicateCache, SqlParseError, SqlPredicate
from data_plane.remoting.codes import PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.headers import field_int
from data_plane.store.status import GetMessageStatus

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.broker.pull import PullProcessor

_NOT_FOUND = {GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_FOUND_NULL}
_EMPTY = {GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE}


class FilterRefused(ValueError):
    """A subscription the broker will not filter; the message is the remark to answer with."""


class ConsumerFilterManager:
    def __init__(self, *, enabled: bool = True, max_cached: int = 4096) -> None:
        self.enabled = enabled
        self.cache = PredicateCache(max_cached)

    def predicate(self, group: str, topic: str, expression_type: str, expression: str | None) -> SqlPredicate:
        """The compiled predicate of a non-TAG subscription; raises FilterRefused saying why not."""
        kind = (expression_type or "").upper()
        if kind != EXPRESSION_TYPE_SQL92:
            raise FilterRefused(f"expression type {expression_type} is not supported (TAG or SQL92)")
        if not self.enabled:
            raise FilterRefused("the broker does not support SQL92 filtering (enable_property_filter is false)")
        try:
            return self.cache.get(group, topic, expression or "")
        except SqlParseError as e:
            raise FilterRefused(str(e)) from None

    def check(self, group: str, topic: str, expression_type: Any, expression: Any) -> str | None:
        """Why a subscription (from a heartbeat or CHECK_CLIENT_CONFIG) cannot be served, or None."""
        kind = str(expression_type or "TAG")
        if kind.upper() == "TAG":
            return None
        try:
            self.predicate(group, topic, kind, expression if isinstance(expression, str) else None)
        except FilterRefused as e:
            return str(e)
        return None

    def check_subscription_data(self, group: str, sd: Any) -> str | None:
        if not isinstance(sd, dict):
            return None
        return self.check(group, str(sd.get("topic") or ""), sd.get("expressionType"), sd.get("subString"))


def pull_filtered(
    proc: PullProcessor,
    cmd: RemotingCommand,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_nums: int,
    sys_flag: int,
    suspend_ms: int,
    expression_type: str,
) -> RemotingCommand | Awaitable[RemotingCommand]:
    """A PULL_MESSAGE whose subscription is not TAG (the checks before it are the pull's own)."""
    broker: Broker = proc.broker
    ext = cmd.ext_fields or {}
    if sys_flag & PULL_FLAG_SUBSCRIPTION:
        expression: str | None = ext.get("subscription")
    else:
        sd = broker.clients.subscription(group, topic)
        if sd is None:
            return cmd.response(ResponseCode.SUBSCRIPTION_NOT_EXIST, f"the consumer's subscription not exist, {group}")
        expression = sd.get("subString")
        expression_type = str(sd.get("expressionType") or expression_type)
    try:
        pred = broker.consumer_filter.predicate(group, topic, expression_type, expression)
    except FilterRefused as e:
        return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
    max_nums = min(max_nums, proc.config.max_pull_messages)
    if sys_flag & PULL_FLAG_COMMIT_OFFSET and broker.config.is_master:
        commit = field_int(ext, "commitOffset", -1)
        if commit >= 0:
            broker.offsets.commit(group, topic, queue_id, commit)
    record_filter = pred.matches_record
    result = proc.store.get_message(topic, queue_id, offset, max_nums, record_filter=record_filter)
    nothing = result.status in _NOT_FOUND or (result.status in _EMPTY and offset == 0)
    if nothing and sys_flag & PULL_FLAG_SUSPEND:
        hold_ms = min(suspend_ms, proc.config.max_suspend_ms)
        if not proc.config.long_polling_enable:
            hold_ms = min(hold_ms, proc.config.short_polling_ms)
        if hold_ms > 0:
            # Woken by any arrival (a tag hash says nothing about properties), then re-read.
            fut = proc.hold.hold(topic, queue_id, offset, hold_ms / 1000, None)
            if fut is not None:
                return _held(proc, cmd, fut, topic, queue_id, offset, max_nums, pred)
    return proc._answer(cmd, result, offset, topic)


async def _held(
    proc: PullProcessor,
    cmd: RemotingCommand,
    fut: Awaitable[bool],
    topic: str,
    queue_id: int,
    offset: int,
    max_nums: int,
    pred: SqlPredicate,
) -> RemotingCommand:
    await fut
    result = proc.store.get_message(topic, queue_id, offset, max_nums, record_filter=pred.matches_record)
    return proc._answer(cmd, result, offset, topic)
