"""Subscriptions: a topic and a tag expression ("*", or "TagA || TagB"), RocketMQ's FilterAPI,
or a SQL92 expression over user properties (``MessageSelector.sql("a > 5 AND b = 'x'")``, checked
here with the broker's own parser, filtered by the broker; docs/filters_and_trace.md).

The broker filters a pull by the tags' hash codes only (the ConsumeQueue keeps the hash, not
the tag), so two tags with the same hash both pass; the client re-checks each message's tag
exactly (``matches``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from data_plane.remoting.bodies import SubscriptionData
from data_plane.store.message import tags_hash_code, validate_topic
from sdk.errors import IllegalArgumentError

SUB_ALL = "*"
EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """How a subscription picks messages (RocketMQ's ``MessageSelector``): ``tag("A || B")`` or
    ``sql("a > 5 AND b = 'x'")``."""

    expression_type: str
    expression: str

    @classmethod
    def sql(cls, expression: str) -> MessageSelector:
        return cls(EXPRESSION_TYPE_SQL92, expression)

    @classmethod
    def tag(cls, expression: str = SUB_ALL) -> MessageSelector:
        return cls(EXPRESSION_TYPE_TAG, expression)

    # RocketMQ's Java names
    by_sql = sql
    by_tag = tag


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str  # "*" or the tags joined with " || "
    tags: tuple[str, ...]  # empty for "*"
    version: int  # ms; a newer version replaces an older one on the broker
    expression_type: str = EXPRESSION_TYPE_TAG  # or SQL92: the broker filters, tags is empty

    @property
    def codes(self) -> tuple[int, ...]:
        return tuple(tags_hash_code(t) for t in self.tags)

    @property
    def all_tags(self) -> bool:
        return not self.tags

    @property
    def is_sql(self) -> bool:
        return self.expression_type == EXPRESSION_TYPE_SQL92

    def matches(self, tags: str | None) -> bool:
        """Whether a message with these tags belongs to the subscription (exact comparison)."""
        return not self.tags or (tags is not None and tags in self.tags)

    def to_wire(self) -> SubscriptionData:
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": list(self.tags),
            "codeSet": list(self.codes),
            "subVersion": self.version,
            "expressionType": self.expression_type,
        }


def parse_subscription(
    topic: str,
    expression: str | MessageSelector | None = SUB_ALL,
    *,
    version: int | None = None,
    sql: str | None = None,
) -> Subscription:
    """Parse a tag expression, a ``MessageSelector`` or (``sql=``) a SQL92 expression; raises
    IllegalArgumentError for a bad topic or expression (a SQL92 error names the position)."""
    why = validate_topic(topic)
    if why is not None:
        raise IllegalArgumentError(why)
    version = int(time.time() * 1000) if version is None else version
    if isinstance(expression, MessageSelector):
        if expression.expression_type.upper() == EXPRESSION_TYPE_SQL92:
            sql = expression.expression
        elif expression.expression_type.upper() != EXPRESSION_TYPE_TAG:
            raise IllegalArgumentError(f"expression type {expression.expression_type!r} is not TAG or SQL92")
        expression = expression.expression if sql is None else SUB_ALL
    if sql is not None:
        if expression not in (None, "", SUB_ALL):
            raise IllegalArgumentError("give a tag expression or sql=, not both")
        from data_plane.filter.sql92 import SqlParseError, compile_sql92

        try:
            compile_sql92(sql)
        except SqlParseError as e:
            raise IllegalArgumentError(f"subscription to {topic}: {e}") from None
        return Subscription(topic, sql, (), version, EXPRESSION_TYPE_SQL92)
    text = (expression or "").strip()
    if text in ("", SUB_ALL):
        return Subscription(topic, SUB_ALL, (), version)
    tags: list[str] = []
    for part in text.split("||"):
        tag = part.strip()
        if not tag:
            continue
        if tag == SUB_ALL:
            raise IllegalArgumentError(f"expression {expression!r}: '*' cannot be combined with tags")
        if tag not in tags:
            tags.append(tag)
    if not tags:
        raise IllegalArgumentError(f"expression {expression!r} names no tag")
    return Subscription(topic, " || ".join(tags), tuple(tags), version)
