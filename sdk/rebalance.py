"""Allocation strategies: which of a topic's queues this consumer of a group takes.

Every consumer of a group runs the same strategy over the same inputs — the topic's queues
and the group's client ids, both sorted — so each comes to the same split without talking to
the others. They are pure functions of their inputs, byte-compatible with RocketMQ's Java
strategies (a Java and a Python consumer in one group agree on the split):

* ``AllocateAveragely`` — AllocateMessageQueueAveragely: contiguous blocks, the first
  ``len(mqs) % len(cids)`` consumers one queue more.
* ``AllocateConsistentHash`` — AllocateMessageQueueConsistentHash: a ring of ``virtual_nodes``
  points per consumer (MD5 of ``"<cid>-<i>"``, first 4 bytes); a queue goes to the first point
  at or after the hash of its Java ``toString``. A consumer joining or leaving moves only
  about ``1/len(cids)`` of the queues.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Protocol

from sdk.message import MessageQueue


class AllocateStrategy(Protocol):
    name: str

    def allocate(
        self, group: str, current_cid: str, mqs: Sequence[MessageQueue], cids: Sequence[str]
    ) -> list[MessageQueue]: ...


def _check(current_cid: str, mqs: Sequence[MessageQueue], cids: Sequence[str]) -> bool:
    if not current_cid:
        raise ValueError("current_cid is empty")
    return bool(mqs) and current_cid in cids


class AllocateAveragely:
    name = "AVG"

    def allocate(
        self, group: str, current_cid: str, mqs: Sequence[MessageQueue], cids: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check(current_cid, mqs, cids):
            return []
        mq_all = sorted(mqs)
        cid_all = sorted(cids)
        index = cid_all.index(current_cid)
        n, c = len(mq_all), len(cid_all)
        mod = n % c
        if n <= c:
            average = 1
        elif mod > 0 and index < mod:
            average = n // c + 1
        else:
            average = n // c
        start = index * average if mod > 0 and index < mod else index * average + mod
        count = min(average, n - start)
        return [mq_all[(start + i) % n] for i in range(count)]


def java_mq_string(mq: MessageQueue) -> str:
    """MessageQueue.toString() of the Java client: the key the consistent hash uses."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def md5_hash(key: str) -> int:
    """RocketMQ's ConsistentHashRouter.MD5Hash: the digest's first 4 bytes, big-endian, unsigned."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


class AllocateConsistentHash:
    name = "CONSISTENT_HASH"

    def __init__(self, virtual_nodes: int = 10) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be at least 1")
        self.virtual_nodes = virtual_nodes

    def ring(self, cids: Sequence[str]) -> tuple[list[int], list[str]]:
        points: dict[int, str] = {}
        for cid in cids:  # later points overwrite earlier ones on a collision, as the Java TreeMap does
            for i in range(self.virtual_nodes):
                points[md5_hash(f"{cid}-{i}")] = cid
        keys = sorted(points)
        return keys, [points[k] for k in keys]

    def allocate(
        self, group: str, current_cid: str, mqs: Sequence[MessageQueue], cids: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check(current_cid, mqs, cids):
            return []
        keys, owners = self.ring(sorted(cids))
        out: list[MessageQueue] = []
        for mq in sorted(mqs):
            i = bisect.bisect_left(keys, md5_hash(java_mq_string(mq)))
            if owners[i % len(keys)] == current_cid:
                out.append(mq)
        return out
