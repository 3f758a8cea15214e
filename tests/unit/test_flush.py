"""Flushing: group commit under SYNC_FLUSH, the flush thread under ASYNC_FLUSH, and the
checkpoint written after flushing (flush.py, message_store.py, checkpoint.py)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

import pytest

from data_plane.store import FlushDiskType, GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.checkpoint import StoreCheckpoint
from data_plane.store.message import decode_record
from data_plane.store.service import BACKGROUND_NICE
from data_plane.store.status import PutMessageResult

DEADLINE_S = 5.0


def _poll(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    """True as soon as ``condition()`` holds; False if it still does not at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _end(result: PutMessageResult) -> int:
    assert result.append is not None
    return result.append.wrote_offset + result.append.wrote_bytes


# --- SYNC_FLUSH -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sync_flush_answers_64_concurrent_puts_only_once_their_bytes_are_flushed(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    mfq = store.commit_log.mfq

    async def put(i: int) -> tuple[PutMessageResult, int]:
        result = await store.put_message(Message("T", b"sync %02d " % i * 40, queue_id=i % 4))
        return result, mfq.flushed_where  # what was durable at the moment the put answered

    answers = await asyncio.gather(*(put(i) for i in range(64)))
    assert [r.status for r, _ in answers] == [PutMessageStatus.PUT_OK] * 64
    for result, flushed_when_answered in answers:
        assert flushed_when_answered >= _end(result)
    assert mfq.flushed_where >= max(_end(r) for r, _ in answers)
    assert mfq.flushed_where == store.max_phy_offset()
    assert sum(store.max_offset_in_queue("T", q) for q in range(4)) == 64


@pytest.mark.asyncio
async def test_sync_flush_answers_a_batch_once_the_whole_batch_is_flushed(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    result = await store.put_messages([Message("T", b"batch %d" % i * 100) for i in range(20)])
    assert result.status is PutMessageStatus.PUT_OK
    assert store.commit_log.mfq.flushed_where >= _end(result)


@pytest.mark.asyncio
async def test_a_message_with_wait_false_returns_without_waiting_for_the_flush(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=30_000)
    assert store._group_commit is not None
    store._group_commit.stop()  # nothing will flush the log any more
    started = time.monotonic()
    result = await asyncio.wait_for(store.put_message(Message("T", b"no wait", properties={"WAIT": "false"})), 5)
    assert time.monotonic() - started < 5
    assert result.status is PutMessageStatus.PUT_OK
    assert store.commit_log.mfq.flushed_where < _end(result)  # answered before any flush
    assert store.get_message("T", 0, 0, 1).status is GetMessageStatus.FOUND


@pytest.mark.asyncio
async def test_a_put_whose_flush_never_comes_answers_flush_disk_timeout_after_the_timeout(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=200)
    assert store._group_commit is not None
    store._group_commit.stop()
    started = time.monotonic()
    results = await asyncio.gather(*(store.put_message(Message("T", b"late %d" % i)) for i in range(3)))
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 3
    assert all(r.reason for r in results)
    assert 0.19 <= elapsed < DEADLINE_S
    # The message is in the store all the same: only its durability is unknown.
    r = store.get_message("T", 0, 0, 32)
    assert r.status is GetMessageStatus.FOUND
    assert [decode_record(m).body for m in r.messages] == [b"late 0", b"late 1", b"late 2"]


def test_puts_from_two_event_loops_each_time_out_on_their_own_loop(
    make_store: Callable[..., MessageStore],
) -> None:
    """Each loop's waiters have their own deadline sweep: a second loop's puts time out too
    while the first loop's sweep is still scheduled."""
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=300)
    assert store._group_commit is not None
    store._group_commit.stop()
    first_waiting = threading.Event()
    out: dict[str, list[PutMessageStatus]] = {}

    async def puts(name: str, n: int) -> None:
        tasks = [
            asyncio.ensure_future(store.put_message(Message("T", b"%s %d" % (name.encode(), i)))) for i in range(n)
        ]
        await asyncio.sleep(0)
        first_waiting.set()
        out[name] = [r.status for r in await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)]

    first = threading.Thread(target=asyncio.run, args=(puts("first", 2),))
    first.start()
    assert first_waiting.wait(DEADLINE_S)
    second = threading.Thread(target=asyncio.run, args=(puts("second", 2),))
    second.start()
    first.join(DEADLINE_S * 2)
    second.join(DEADLINE_S * 2)
    assert out == {
        "first": [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 2,
        "second": [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 2,
    }


def test_a_blocking_put_whose_flush_never_comes_answers_flush_disk_timeout_with_a_reason(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=200)
    assert store._group_commit is not None
    store._group_commit.stop()
    started = time.monotonic()
    result = store.put_messages_blocking([Message("T", b"late")])
    elapsed = time.monotonic() - started
    assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert 0.19 <= elapsed < DEADLINE_S
    assert store.look_message_by_offset(0) is not None
    assert result.reason, "a blocking put's timeout must say why, as an awaited put's does"


def test_put_messages_blocking_waits_for_the_group_commit_without_an_event_loop(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    mfq = store.commit_log.mfq
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # really no loop here
    for i in range(10):
        result = store.put_messages_blocking([Message("T", b"blocking %d" % i * 50)])
        assert result.status is PutMessageStatus.PUT_OK
        assert mfq.flushed_where >= _end(result)

    # From a tool's own thread as well.
    answers: list[tuple[PutMessageResult, int]] = []

    def tool() -> None:
        for i in range(5):
            res = store.put_messages_blocking([Message("T", b"from a thread %d" % i)])
            answers.append((res, mfq.flushed_where))

    t = threading.Thread(target=tool)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    assert len(answers) == 5
    for res, flushed in answers:
        assert res.status is PutMessageStatus.PUT_OK
        assert flushed >= _end(res)
    assert store.max_offset_in_queue("T", 0) == 15


# --- ASYNC_FLUSH ------------------------------------------------------------------------------


def test_async_flush_advances_the_flush_point_to_the_max_offset_on_its_own_across_files(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_commit_log_least_pages=0)
    for i in range(150):
        assert store.put_messages_blocking([Message("T", b"%04d" % i + b"a" * 996)]).ok
    assert len(store.commit_log.mfq.files) >= 2
    target = store.max_phy_offset()
    assert _poll(lambda: store.commit_log.mfq.flushed_where >= target)
    assert store.commit_log.mfq.flushed_where == target


def test_async_flush_flushes_once_enough_pages_are_dirty(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        flush_commit_log_least_pages=4,
        flush_commit_log_thorough_interval_ms=3_600_000,  # no thorough flush during the test
    )
    # One batch of six pages: the flusher sees all of it or none of it.
    result = store.put_messages_blocking([Message("T", b"p" * 1000) for _ in range(24)])
    assert result.ok
    assert _poll(lambda: store.commit_log.mfq.flushed_where >= _end(result))
    assert store.commit_log.mfq.flushed_where == store.max_phy_offset()


def test_async_flush_flushes_a_few_dirty_bytes_at_the_thorough_interval(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        flush_commit_log_least_pages=4,
        flush_commit_log_thorough_interval_ms=200,
    )
    result = store.put_messages_blocking([Message("T", b"tiny")])  # far less than 4 pages
    assert result.ok
    assert _poll(lambda: store.commit_log.mfq.flushed_where >= _end(result))
    assert store.commit_log.mfq.flushed_where == store.max_phy_offset()


def test_the_checkpoint_records_the_flushed_log_and_index_offsets(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_commit_log_least_pages=0)
    for i in range(100):
        msg = Message("T", b"cp %d" % i * 30, queue_id=i % 3, properties={"KEYS": f"k{i}"})
        assert store.put_messages_blocking([msg]).ok
    target = store.max_phy_offset()

    def checkpoint_caught_up() -> bool:
        cp = StoreCheckpoint.load(store.config.checkpoint_path)
        return cp.valid and cp.physic_offset == target and cp.logics_offset == target and cp.index_offset == target

    assert _poll(checkpoint_caught_up)
    cp = StoreCheckpoint.load(store.config.checkpoint_path)
    assert cp.min_offset() == target
    # The checkpoint never claims more than what is flushed.
    assert cp.physic_offset <= store.commit_log.mfq.flushed_where


def test_shutdown_flushes_everything_and_leaves_a_checkpoint_at_the_max_offset(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        flush_commit_log_least_pages=1000,
        flush_commit_log_thorough_interval_ms=3_600_000,
    )
    for i in range(30):
        assert store.put_messages_blocking([Message("T", b"shutdown %d" % i)]).ok
    target = store.max_phy_offset()
    store.shutdown()
    cp = StoreCheckpoint.load(store.config.checkpoint_path)
    assert cp.valid
    assert (cp.physic_offset, cp.logics_offset, cp.index_offset) == (target, target, target)


def _thread_nice(name: str) -> int:
    """The kernel's nice value of this process's thread named ``name`` (/proc, field 19)."""
    thread = next(t for t in threading.enumerate() if t.name == name)
    with open(f"/proc/self/task/{thread.native_id}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="needs per-thread nice values (Linux)")
@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_threads_whose_work_may_wait_run_at_a_lower_priority_and_the_group_commit_does_not(
    make_store: Callable[..., MessageStore], flush: FlushDiskType
) -> None:
    # The event loop must take the core at once from a flush that is queueing pages for the
    # disk; an acknowledgement under SYNC_FLUSH waits for the group commit, which keeps its place.
    store = make_store(flush_disk_type=flush)
    assert store.put_messages_blocking([Message("T", b"x" * 100)]).ok
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = ["orbit-flush-consumequeue", "orbit-reserve-ahead"]
    lowered += ["orbit-flush-commitlog"] if flush == FlushDiskType.ASYNC_FLUSH else []
    assert _poll(lambda: all(_thread_nice(n) == BACKGROUND_NICE for n in lowered)), {
        n: _thread_nice(n) for n in lowered
    }
    if flush == FlushDiskType.SYNC_FLUSH:
        assert _thread_nice("orbit-group-commit") == mine
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine, "the calling thread keeps its own"
