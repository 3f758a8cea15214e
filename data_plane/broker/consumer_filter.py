"""ConsumerFilterManager: SQL92 subscriptions on the broker (RocketMQ's ``ConsumerFilterManager``
and ``ExpressionMessageFilter`` for ``ExpressionType.SQL92``).

    CHECK_CLIENT_CONFIG (46) ─┐
    HEART_BEAT (34)          ─┼─▶ check(type, expression) ─▶ None | "SQL92 expression error at position n: …"
    PULL_MESSAGE (11) ────────┘      └─ compiled once per (group, topic, expression): PredicateCache
        └─ expressionType SQL92 ─▶ resolve_predicate ─▶ MessageStore.get_message(record_filter=pred.matches_record)

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

from typing import TYPE_CHECKING, Any

from data_plane.filter.sql92 import EXPRESSION_TYPE_SQL92, PredicateCache, SqlParseError, SqlPredicate
from data_plane.remoting.codes import PULL_FLAG_SUBSCRIPTION, ResponseCode
from data_plane.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker


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


def resolve_predicate(
    broker: Broker, cmd: RemotingCommand, group: str, topic: str, sys_flag: int, expression_type: str
) -> SqlPredicate | RemotingCommand:
    """The compiled filter of a PULL_MESSAGE whose subscription is not TAG — from the request
    (PULL_FLAG_SUBSCRIPTION) or the group's heartbeat — or the answer refusing it."""
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
        return broker.consumer_filter.predicate(group, topic, expression_type, expression)
    except FilterRefused as e:
        return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
