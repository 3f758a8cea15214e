"""Stream offsets: where a streaming query stands in every queue it reads.

Spark keeps a source's offset as JSON in the query's checkpoint (``offsets/<batch id>``) and
hands it back after a restart, so the form is the one ``startingOffsets`` takes::

    {"acme%orders": {"broker-a:0": 1200, "broker-a:1": 1187}, "acme%refunds": {"broker-a:0": 4}}

Each value is the next consume offset of that queue (the first message not yet read); a micro-
batch reads ``[start, end)`` of every queue. Keys are sorted, so equal offsets are equal strings.

``cap`` is the admission control of ``maxMessagesPerTrigger``: it shares a budget of messages
between the queues that have something new, fairly (each gets an equal share; what a queue
cannot use goes to the others), deterministically (queues in name order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_integration.errors import OrbitSparkError

QueueKey = tuple[str, str, int]  # (topic, broker name, queue id)
Offsets = dict[QueueKey, int]


def to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for topic, broker, queue_id in sorted(offsets):
        out.setdefault(topic, {})[f"{broker}:{queue_id}"] = offsets[(topic, broker, queue_id)]
    return out


def from_json(doc: Any, what: str = "stream offset") -> Offsets:
    """The offsets of a checkpoint (or of ``to_json``); a clear error for anything else."""
    if not isinstance(doc, Mapping):
        raise OrbitSparkError(f'{what} must be a JSON object {{"topic": {{"broker:queue": offset}}}}, got {doc!r}')
    out: Offsets = {}
    for topic, queues in doc.items():
        if not isinstance(queues, Mapping):
            raise OrbitSparkError(f"{what}: topic {topic!r} must map 'broker:queue' to an offset")
        for key, offset in queues.items():
            broker, _, qid = str(key).rpartition(":")
            if not broker or not qid.isdigit():
                raise OrbitSparkError(f"{what}: {key!r} of topic {topic!r} is not 'broker:queueId'")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise OrbitSparkError(f"{what}: offset of {topic} {key} must be a whole number >= 0, got {offset!r}")
            out[(str(topic), broker, int(qid))] = offset
    return out


def describe(key: QueueKey) -> str:
    topic, broker, queue_id = key
    return f"queue {broker}:{queue_id} of topic {topic!r}"


def count(start: Mapping[QueueKey, int], end: Mapping[QueueKey, int]) -> int:
    """Offsets between ``start`` and ``end`` (a queue missing from ``start`` starts at ``end``)."""
    return sum(max(0, e - start.get(k, e)) for k, e in end.items())


def cap(start: Mapping[QueueKey, int], end: Mapping[QueueKey, int], max_messages: int) -> Offsets:
    """``end`` moved back so that at most ``max_messages`` offsets lie between ``start`` and it,
    shared fairly between the queues; a queue never goes below its start."""
    if max_messages < 1:
        raise ValueError(f"max_messages must be >= 1, not {max_messages}")
    want = {k: max(0, e - start.get(k, e)) for k, e in end.items()}
    grant = dict.fromkeys(want, 0)
    budget = max_messages
    hungry = sorted(k for k, n in want.items() if n > 0)
    while budget > 0 and hungry:
        share = max(1, budget // len(hungry))
        for k in list(hungry):
            take = min(share, want[k] - grant[k], budget)
            grant[k] += take
            budget -= take
            if grant[k] == want[k]:
                hungry.remove(k)
            if budget == 0:
                break
    return {k: (start[k] + grant[k] if k in start else e) for k, e in end.items()}
