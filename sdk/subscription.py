"""Subscriptions: a topic and a tag expression ("*", or "TagA || TagB"), RocketMQ's FilterAPI.

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


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str  # "*" or the tags joined with " || "
    tags: tuple[str, ...]  # empty for "*"
    version: int  # ms; a newer version replaces an older one on the broker

    @property
    def codes(self) -> tuple[int, ...]:
        return tuple(tags_hash_code(t) for t in self.tags)

    @property
    def all_tags(self) -> bool:
        return not self.tags

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
            "expressionType": EXPRESSION_TYPE_TAG,
        }


def parse_subscription(topic: str, expression: str | None = SUB_ALL, *, version: int | None = None) -> Subscription:
    """Parse a tag expression; raises IllegalArgumentError for a bad topic or expression."""
    why = validate_topic(topic)
    if why is not None:
        raise IllegalArgumentError(why)
    version = int(time.time() * 1000) if version is None else version
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
