"""ProcessQueue (sdk/process_queue.py): the sliding-window commit offset, flow-control counters
and orderly take / commit / rollback."""

from __future__ import annotations

import asyncio
import random

import pytest

from sdk.message import MessageExt
from sdk.process_queue import LOCK_MAX_LIVE_MS, ProcessQueue


def _msg(offset: int, size: int = 10) -> MessageExt:
    return MessageExt(
        topic="T",
        body=b"x" * size,
        properties={},
        queue_id=0,
        queue_offset=offset,
        broker_name="b",
        offset_msg_id="",
        commit_log_offset=0,
        born_timestamp_ms=0,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=0,
        store_host=("127.0.0.1", 2),
    )


def test_commit_offset_is_the_lowest_offset_not_yet_consumed() -> None:
    pq = ProcessQueue()
    msgs = {o: _msg(o) for o in (1, 2, 3, 4)}
    pq.put(list(msgs.values()))
    assert pq.remove([msgs[1]]) == 2
    assert pq.remove([msgs[2]]) == 3
    assert pq.remove([msgs[4]]) == 3, "3 is still being consumed: the window stops there"
    assert pq.remove([msgs[3]]) == 5, "all consumed: one past the highest offset seen"


def test_remove_on_an_empty_queue_reports_nothing_to_commit() -> None:
    assert ProcessQueue().remove([_msg(7)]) == -1


def test_counters_follow_puts_and_removes_and_duplicates_are_ignored() -> None:
    pq = ProcessQueue()
    assert pq.put([_msg(0, 100), _msg(1, 50)]) == 2
    assert pq.put([_msg(1, 50), _msg(2, 1)]) == 1, "offset 1 is cached already"
    assert (pq.count, pq.size_bytes, pq.max_offset) == (3, 151, 2)
    pq.remove([_msg(1, 50)])
    assert (pq.count, pq.size_bytes) == (2, 101)
    assert pq.span == 2
    assert [m.queue_offset for m in pq.messages()] == [0, 2]


def test_commit_offset_equals_a_brute_force_model_under_random_consumption(seed: int) -> None:
    rng = random.Random(seed)
    pq = ProcessQueue()
    cached: set[int] = set()
    next_offset = 0
    highest = -1
    for _ in range(500):
        if rng.random() < 0.4 or not cached:
            batch = [_msg(next_offset + i) for i in range(rng.randrange(1, 5))]
            next_offset += len(batch) + rng.randrange(0, 3)  # gaps: filtered-out messages
            pq.put(batch)
            cached.update(m.queue_offset for m in batch)
            highest = max(highest, batch[-1].queue_offset)
        else:
            done = rng.sample(sorted(cached), rng.randrange(1, min(4, len(cached)) + 1))
            got = pq.remove([_msg(o) for o in done])
            cached.difference_update(done)
            assert got == (min(cached) if cached else highest + 1)
        assert pq.count == len(cached)


def test_flow_control_reports_each_limit() -> None:
    pq = ProcessQueue()
    pq.limits = (3, 1000, 0)
    pq.put([_msg(i) for i in range(3)])
    assert pq.over_limits() is None
    pq.put([_msg(3)])
    assert pq.over_limits() == "4 messages cached, over 3"
    pq.limits = (100, 25, 0)
    assert pq.over_limits() == "40 bytes cached, over 25"
    pq.limits = (100, 1000, 2)
    assert pq.over_limits() == "offset span 3, over 2"
    pq.drop()
    assert pq.over_limits() is None, "a dropped queue never blocks its pull loop"


@pytest.mark.asyncio
async def test_wait_for_room_wakes_when_consumption_brings_the_cache_under_its_limit() -> None:
    pq = ProcessQueue()
    pq.limits = (1, 1 << 20, 0)
    msgs = [_msg(0), _msg(1)]
    pq.put(msgs)
    assert not await pq.wait_for_room(0.01), "over the limit: times out"
    waiter = asyncio.ensure_future(pq.wait_for_room(5))
    await asyncio.sleep(0)
    assert not waiter.done()
    pq.remove([msgs[0]])
    assert await asyncio.wait_for(waiter, 1), "room again after one message was consumed"


def test_orderly_take_commit_and_rollback() -> None:
    pq = ProcessQueue()
    pq.put([_msg(o) for o in (5, 3, 4, 6)])
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [3, 4]
    assert pq.consuming == 2
    assert pq.commit_offset() == 3, "taken but not committed: still the lowest"
    pq.rollback(first)
    assert [m.queue_offset for m in pq.take(3)] == [3, 4, 5], "rolled back messages come first again"
    assert pq.commit() == 6
    assert (pq.count, pq.consuming) == (1, 0)
    assert [m.queue_offset for m in pq.take(5)] == [6]
    assert pq.commit() == 7
    assert pq.commit() == -1, "nothing taken"


def test_orderly_consumption_needs_a_live_lock() -> None:
    pq = ProcessQueue()
    assert not pq.can_consume_orderly(now_ms=0)
    pq.locked = True
    pq.last_lock_ms = 1000
    assert pq.can_consume_orderly(now_ms=1000 + LOCK_MAX_LIVE_MS)
    assert not pq.can_consume_orderly(now_ms=1001 + LOCK_MAX_LIVE_MS)


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_puts_in_any_order_keep_the_window_and_counters(seed: int) -> None:
    """Pulls usually go on past everything cached (the bulk path); redeliveries, overlaps and
    out-of-order batches take the general one. Either way the cache holds each offset once and
    the commit offset is the lowest not consumed."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    pq = ProcessQueue()
    cached: dict[int, int] = {}  # offset -> body size
    seen_max = -1
    for _ in range(200):
        start = rng.randrange(0, 400)
        offsets = sorted(rng.sample(range(start, start + 40), rng.randrange(1, 20)))
        if rng.random() < 0.2:
            offsets.insert(rng.randrange(len(offsets)), rng.randrange(0, start + 1))  # a dip inside the batch
        msgs = [_msg(o, size=o % 7 + 1) for o in offsets]
        new = {m.queue_offset: len(m.body) for m in msgs if m.queue_offset not in cached}
        assert pq.put(msgs) == len(new)
        cached.update(new)
        seen_max = max([seen_max, *offsets])
        assert (pq.count, pq.size_bytes, pq.max_offset) == (len(cached), sum(cached.values()), seen_max)
        if rng.random() < 0.5 and cached:
            done = rng.sample(sorted(cached), rng.randrange(1, len(cached) + 1))
            expected = min((o for o in cached if o not in done), default=seen_max + 1)
            assert pq.remove([_msg(o) for o in done]) == expected
            for o in done:
                del cached[o]
        assert [m.queue_offset for m in pq.messages()] == sorted(cached)


def test_a_long_run_of_puts_takes_rollbacks_and_removes_matches_a_model(seed: int) -> None:
    """Thousands of offsets pass through (the consumed front of the order is dropped now and
    then); orderly takes, commits and rollbacks mix with concurrent removes and redeliveries."""
    rng = random.Random(seed)
    pq = ProcessQueue()
    cached: set[int] = set()
    taken: set[int] = set()
    next_offset = 0
    highest = -1
    for _ in range(6000):
        r = rng.random()
        if r < 0.35 or not cached:
            batch = [_msg(next_offset + i) for i in range(rng.randrange(1, 6))]
            if rng.random() < 0.1 and next_offset:  # a redelivery of something older
                batch.insert(0, _msg(rng.randrange(next_offset)))
            next_offset = max(next_offset, batch[-1].queue_offset + 1) + rng.randrange(0, 3)
            pq.put(batch)
            cached.update(m.queue_offset for m in batch if m.queue_offset not in taken)
            highest = max(highest, *(m.queue_offset for m in batch))
        elif r < 0.5:
            got = pq.take(rng.randrange(1, 4))
            expect = sorted(cached)[: len(got)]
            assert [m.queue_offset for m in got] == expect
            cached.difference_update(expect)
            taken.update(expect)
        elif r < 0.55 and taken:
            pq.rollback()
            cached |= taken
            taken.clear()
        elif r < 0.6 and taken:
            left = cached
            expect_commit = min(left) if left else max(taken) + 1
            assert pq.commit() == expect_commit
            taken.clear()
        else:
            done = rng.sample(sorted(cached), rng.randrange(1, min(4, len(cached)) + 1))
            got_offset = pq.remove([_msg(o) for o in done])
            cached.difference_update(done)
            lows = cached | taken
            assert got_offset == (min(lows) if lows else highest + 1)
        assert pq.count == len(cached) + len(taken)
        assert pq.consuming == len(taken)
        assert pq.span == (highest - min(cached) if cached else 0)
    assert [m.queue_offset for m in pq.messages()] == sorted(cached)
    assert len(pq._order) < 4000  # the consumed front was dropped along the way
