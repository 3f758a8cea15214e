"""LoadReport: what a master broker tells the control plane about its tenants' load, bounded.

    {"broker": "broker-a", "at": <epoch ms>,
     "topics": [{"tenant": "acme", "topic": "orders", "refused": 3,
                 "queues": [{"id": 0, "max_offset": 120, "perm": 6}, ...]}, ...],
     "groups": [{"tenant": "acme", "group": "billing", "topic": "orders",
                 "queues": [{"id": 0, "committed": 100, "max_offset": 120}, ...]}, ...]}

Tenant topics only (``tenant%name``; not the retry and dead-letter topics, not system topics):
per queue its max offset (messages appended so far) and its permission (4 read, 2 write: the
topic's ``perm`` where the queue is below its read/write queue count). Per (consumer group, topic)
of the same tenant: per queue the group committed, its committed offset and the queue's max
offset (backlog = max_offset - committed). ``refused``: the topic's sends and pulls refused for
a quota or a suspended/over-storage tenant since the last report that reached the control plane.

Bounded: at most ``max_items`` topics and groups a report. An item whose figures did not change
since it was last sent (and, for a group, whose backlog is zero) is left out unless it was last
sent ``refresh_s`` ago or more, so an idle topic still has a sample every ``refresh_s``. What
does not fit waits for the next report, items never sent or changed first, then the longest
unsent. ``build`` makes a report; ``sent`` marks it delivered (only then does it count as sent:
a failed report's items are built afresh next time, with the numbers of then).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from data_plane.broker.consumer_offset import TOPIC_GROUP_SEPARATOR
from data_plane.remoting.bodies import TopicConfig
from data_plane.remoting.codes import PERM_READ, PERM_WRITE
from data_plane.tenancy.namespace import parse_wire_name

MaxOffset = Callable[[str, int], int]  # (topic, queue id) -> the queue's max offset
Key = tuple[str, ...]  # ("t", topic) or ("g", group, topic), wire names
Figures = tuple[int, ...]  # what makes an item "changed": its offsets


@dataclass
class Item:
    key: Key
    doc: dict[str, Any]
    figures: Figures
    busy: bool = False  # a group with a backlog, a topic with refusals: sent every report


@dataclass
class Report:
    doc: dict[str, Any]
    items: list[Item] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # wire topic -> refusals it carries
    left_out: int = 0  # items due that did not fit


def queue_perm(tc: TopicConfig, queue_id: int) -> int:
    perm = tc.get("perm", PERM_READ | PERM_WRITE)
    out = 0
    if queue_id < tc.get("readQueueNums", 0) and perm & PERM_READ:
        out |= PERM_READ
    if queue_id < tc.get("writeQueueNums", 0) and perm & PERM_WRITE:
        out |= PERM_WRITE
    return out


def tenant_topics(topics: Mapping[str, TopicConfig]) -> dict[str, tuple[str, str]]:
    """wire name -> (tenant, name) of the tenants' own topics (no retry, dead-letter or system topic)."""
    out = {}
    for wire in topics:
        special, tenant, name = parse_wire_name(wire)
        if not special and tenant is not None:
            out[wire] = (tenant, name)
    return out


def topic_items(topics: Mapping[str, TopicConfig], max_offset: MaxOffset, refused: Mapping[str, int]) -> list[Item]:
    items = []
    for wire, (tenant, name) in tenant_topics(topics).items():
        tc = topics[wire]
        n = max(tc.get("readQueueNums", 0), tc.get("writeQueueNums", 0))
        queues = [{"id": q, "max_offset": max(0, max_offset(wire, q)), "perm": queue_perm(tc, q)} for q in range(n)]
        doc = {"tenant": tenant, "topic": name, "queues": queues, "refused": refused.get(wire, 0)}
        figures = (n, *(q["max_offset"] for q in queues))
        items.append(Item(("t", wire), doc, figures, busy=refused.get(wire, 0) > 0))
    return items


def group_items(
    topics: Mapping[str, TopicConfig], offset_table: Mapping[str, Mapping[int, int]], max_offset: MaxOffset
) -> list[Item]:
    """Per (group, topic) of one tenant with committed offsets here: its queues' committed and max offsets."""
    own = tenant_topics(topics)
    items = []
    for key, committed in offset_table.items():
        wire_topic, sep, wire_group = key.partition(TOPIC_GROUP_SEPARATOR)
        if not sep or wire_topic not in own:
            continue
        g_special, g_tenant, group = parse_wire_name(wire_group)
        tenant, name = own[wire_topic]
        if g_special or g_tenant != tenant:
            continue
        queues = []
        backlog = 0
        for q in sorted(committed):
            done = committed[q]
            if done < 0:
                continue
            top = max(0, max_offset(wire_topic, q))
            queues.append({"id": q, "committed": done, "max_offset": top})
            backlog += max(0, top - done)
        if not queues:
            continue
        doc = {"tenant": tenant, "group": group, "topic": name, "queues": queues}
        figures = tuple(v for q in queues for v in (q["committed"], q["max_offset"]))
        items.append(Item(("g", wire_group, wire_topic), doc, figures, busy=backlog > 0))
    return items


class LoadReports:
    """Builds bounded reports and remembers what was last delivered (``sent``)."""

    def __init__(self, broker: str, *, max_items: int = 500, refresh_s: float = 120.0) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.broker = broker
        self.max_items = max_items
        self.refresh_s = refresh_s
        self._sent: dict[Key, tuple[Figures, float]] = {}  # key -> (figures, when) last delivered

    def build(
        self,
        *,
        now_s: float,
        topics: Mapping[str, TopicConfig],
        offset_table: Mapping[str, Mapping[int, int]],
        max_offset: MaxOffset,
        refused: Mapping[str, int],
    ) -> Report:
        """The report due at ``now_s`` (wall clock, seconds); an empty one when nothing is due."""
        candidates = topic_items(topics, max_offset, refused) + group_items(topics, offset_table, max_offset)
        due: list[tuple[int, float, Item]] = []  # (0: new, changed or busy; 1: refresh), last sent, item
        for item in candidates:
            last = self._sent.get(item.key)
            if last is None or last[0] != item.figures or item.busy:
                due.append((0, last[1] if last else 0.0, item))
            elif now_s - last[1] >= self.refresh_s:
                due.append((1, last[1], item))
        due.sort(key=lambda d: (d[0], d[1]))
        chosen = [d[2] for d in due[: self.max_items]]
        doc: dict[str, Any] = {
            "broker": self.broker,
            "at": int(now_s * 1000),
            "topics": [i.doc for i in chosen if i.key[0] == "t"],
            "groups": [i.doc for i in chosen if i.key[0] == "g"],
        }
        refused_sent = Counter({i.key[1]: i.doc["refused"] for i in chosen if i.key[0] == "t" and i.doc["refused"]})
        live = {c.key for c in candidates}
        for gone in [k for k in self._sent if k not in live]:  # deleted topics, groups
            del self._sent[gone]
        return Report(doc, chosen, refused_sent, left_out=len(due) - len(chosen))

    def sent(self, report: Report, *, now_s: float) -> None:
        for item in report.items:
            self._sent[item.key] = (item.figures, now_s)
