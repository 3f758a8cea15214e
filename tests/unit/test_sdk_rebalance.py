"""Allocation strategies (sdk/rebalance.py): RocketMQ's averagely split exactly, and a stable,
balanced consistent hash."""

from __future__ import annotations

import hashlib
import random

import pytest

from sdk.message import MessageQueue
from sdk.rebalance import AllocateAveragely, AllocateConsistentHash, java_mq_string, md5_hash


def _mqs(n: int, brokers: int = 1) -> list[MessageQueue]:
    per = n // brokers
    return [MessageQueue("T", f"broker-{b}", q) for b in range(brokers) for q in range(per)]


def _ids(mqs: list[MessageQueue]) -> list[tuple[str, int]]:
    return [(q.broker_name, q.queue_id) for q in mqs]


def _split(
    strategy: AllocateAveragely | AllocateConsistentHash, mqs: list[MessageQueue], cids: list[str]
) -> dict[str, list[MessageQueue]]:
    return {c: strategy.allocate("G", c, mqs, cids) for c in cids}


# --- averagely ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n_queues", "n_consumers", "expected"),
    [
        # RocketMQ's AllocateMessageQueueAveragely: the first n % c consumers get one queue more.
        (10, 3, [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]),
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (4, 4, [[0], [1], [2], [3]]),
        (4, 6, [[0], [1], [2], [3], [], []]),
        (5, 1, [[0, 1, 2, 3, 4]]),
        (7, 2, [[0, 1, 2, 3], [4, 5, 6]]),
    ],
)
def test_averagely_matches_rocketmq_examples(n_queues: int, n_consumers: int, expected: list[list[int]]) -> None:
    mqs = _mqs(n_queues)
    cids = [f"cid-{i}" for i in range(n_consumers)]
    got = [[q.queue_id for q in AllocateAveragely().allocate("G", c, mqs, cids)] for c in cids]
    assert got == expected


def test_averagely_sorts_queues_and_ids_so_every_client_agrees_whatever_order_it_sees() -> None:
    mqs = _mqs(8, brokers=2)
    cids = ["c", "a", "b"]
    reference = _split(AllocateAveragely(), sorted(mqs), sorted(cids))
    shuffled = list(reversed(mqs))
    for c in cids:
        assert AllocateAveragely().allocate("G", c, shuffled, ["b", "c", "a"]) == reference[c]
    # Sorted by (topic, broker, queue id): "a" gets broker-0's queues 0..2.
    assert _ids(reference["a"]) == [("broker-0", 0), ("broker-0", 1), ("broker-0", 2)]


def test_averagely_gives_nothing_to_a_consumer_the_broker_does_not_list() -> None:
    assert AllocateAveragely().allocate("G", "stranger", _mqs(4), ["a", "b"]) == []
    assert AllocateAveragely().allocate("G", "a", [], ["a", "b"]) == []


def test_averagely_covers_every_queue_once_with_shares_differing_by_at_most_one(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        mqs = _mqs(rng.randrange(1, 64), brokers=1)
        cids = [f"10.0.0.{rng.randrange(256)}@{rng.randrange(1 << 16)}#{i}" for i in range(rng.randrange(1, 12))]
        split = _split(AllocateAveragely(), mqs, cids)
        flat = [q for qs in split.values() for q in qs]
        assert sorted(flat) == sorted(mqs), "every queue exactly once"
        sizes = [len(qs) for qs in split.values()]
        assert max(sizes) - min(sizes) <= 1


# --- consistent hash ------------------------------------------------------------------------------
def test_md5_hash_is_the_first_four_digest_bytes_big_endian() -> None:
    digest = hashlib.md5(b"cid-1-0").digest()
    assert md5_hash("cid-1-0") == int.from_bytes(digest[:4], "big")
    assert java_mq_string(MessageQueue("T", "b", 3)) == "MessageQueue [topic=T, brokerName=b, queueId=3]"


def test_consistent_hash_covers_every_queue_exactly_once(seed: int) -> None:
    rng = random.Random(seed)
    mqs = _mqs(64, brokers=2)
    cids = [f"cid-{rng.randrange(1 << 30)}" for _ in range(5)]
    split = _split(AllocateConsistentHash(), mqs, cids)
    flat = [q for qs in split.values() for q in qs]
    assert sorted(flat) == sorted(mqs)


def test_consistent_hash_moves_only_queues_to_a_joining_consumer(seed: int) -> None:
    rng = random.Random(seed)
    mqs = _mqs(128, brokers=4)
    cids = [f"10.1.1.{rng.randrange(256)}@{rng.randrange(1 << 16)}#{rng.randrange(1 << 24):06x}" for _ in range(4)]
    joiner = f"10.9.9.9@1#{rng.randrange(1 << 24):06x}"
    strategy = AllocateConsistentHash()
    before = {q: c for c, qs in _split(strategy, mqs, cids).items() for q in qs}
    after = {q: c for c, qs in _split(strategy, mqs, [*cids, joiner]).items() for q in qs}
    moved = {q for q in mqs if before[q] != after[q]}
    assert all(after[q] == joiner for q in moved), "a queue only ever moves to the new consumer"
    # And leaving is the mirror image: the others keep what they had.
    assert {q: c for q, c in after.items() if c != joiner} == {q: before[q] for q in mqs if q not in moved}


def test_consistent_hash_is_the_same_whatever_order_ids_and_queues_arrive_in(seed: int) -> None:
    rng = random.Random(seed)
    mqs = _mqs(32, brokers=2)
    cids = [f"cid-{i}-{rng.randrange(1000)}" for i in range(3)]
    reference = _split(AllocateConsistentHash(), mqs, cids)
    shuffled_mqs, shuffled_cids = mqs[:], cids[:]
    rng.shuffle(shuffled_mqs)
    rng.shuffle(shuffled_cids)
    assert _split(AllocateConsistentHash(), shuffled_mqs, shuffled_cids) == reference


def test_consistent_hash_is_roughly_balanced_with_enough_virtual_nodes(seed: int) -> None:
    rng = random.Random(seed)
    mqs = _mqs(256, brokers=4)
    cids = [f"10.0.0.{rng.randrange(256)}@{rng.randrange(99999)}#{rng.randrange(1 << 24):06x}" for _ in range(4)]
    counts = [len(qs) for qs in _split(AllocateConsistentHash(virtual_nodes=40), mqs, cids).values()]
    fair = len(mqs) // len(cids)
    assert min(counts) >= fair // 4, counts
    assert max(counts) <= fair * 2, counts


def test_consistent_hash_refuses_zero_virtual_nodes_and_ignores_strangers() -> None:
    with pytest.raises(ValueError, match="virtual_nodes"):
        AllocateConsistentHash(0)
    assert AllocateConsistentHash().allocate("G", "stranger", _mqs(4), ["a"]) == []
