"""Idle ConsumeQueues hold no mapping and no descriptor, and come back on their next append or read
(store/idle_queues.py, ConsumeQueue.detach_idle and reopen)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from data_plane.broker.config import BrokerConfig, ConfigError
from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.idle_queues import IdleQueues
from data_plane.store.message import decode_record
from tests.conftest import ManualClock, run_store_script
from tests.unit.test_message_store import _pull_all

IDLE_S = 1.0
MakeStore = Callable[..., MessageStore]


def _put(store: MessageStore, topic: str, queue_id: int, body: bytes) -> int:
    result = store.put_messages_blocking([Message(topic, body, queue_id=queue_id, properties={"TAGS": "t"})])
    assert result.status is PutMessageStatus.PUT_OK, result
    assert result.append is not None
    return result.append.queue_offset


def _bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    return [m.body for m in _pull_all(store, topic, queue_id)]


def _queue_dir(store: MessageStore, topic: str, queue_id: int) -> str:
    return os.path.join(store.config.consume_queue_path, topic, str(queue_id))


def _closed(store: MessageStore, topic: str, queue_id: int) -> bool:
    cq = store.queues.get(topic, queue_id)
    assert cq is not None
    return cq.closed


def _mapped(directory: str) -> list[str]:
    """Lines of /proc/self/maps naming a file under ``directory``."""
    with open("/proc/self/maps") as f:
        return [line for line in f if directory + os.sep in line]


def _open_fds(directory: str) -> list[str]:
    """The process's descriptors on files under ``directory``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(directory + os.sep):
            out.append(target)
    return out


def _sweep(idle: IdleQueues) -> int:
    return asyncio.run(idle.sweep())


def _idle_store(make_store: MakeStore, clock: ManualClock, topics: dict[str, int]) -> tuple[MessageStore, IdleQueues]:
    """A store whose ``topics`` (topic → messages per queue, 2 queues each) were written, then
    left unused past the idle time and swept."""
    store = make_store()
    for topic, n in topics.items():
        for q in range(2):
            for i in range(n):
                _put(store, topic, q, f"{topic}-{q}-{i}".encode())
    idle = IdleQueues(store, IDLE_S)
    assert _sweep(idle) == 0  # first sight: in use now
    clock.advance(int(IDLE_S * 1000) + 1)
    return store, idle


def test_an_idle_queue_is_unmapped_and_holds_no_descriptor(
    make_store: MakeStore, clock: ManualClock, write_path: str
) -> None:
    store, idle = _idle_store(make_store, clock, {"Idle": 150, "Warm": 3})  # 150: past a 64-unit file
    directory = _queue_dir(store, "Idle", 0)
    assert _mapped(directory), "a queue in use is mapped"
    assert _open_fds(directory), "... and its mappings hold descriptors"
    _put(store, "Warm", 0, b"still written")  # Warm's queue 0 was used since the last look
    assert _sweep(idle) == 3
    for q in range(2):
        d = _queue_dir(store, "Idle", q)
        assert _mapped(d) == []
        assert _open_fds(d) == []
        assert _closed(store, "Idle", q)
    assert _mapped(_queue_dir(store, "Warm", 0)), "a queue written since the last look stays mapped"
    assert not _mapped(_queue_dir(store, "Warm", 1))
    info = idle.runtime_info()
    assert info["idleClosedQueues"] == 3
    assert info["mappedQueueFiles"] == 1
    assert info["openFds"] > 0


def test_offsets_answer_from_memory_and_a_pull_at_the_end_keeps_the_queue_closed(
    make_store: MakeStore, clock: ManualClock
) -> None:
    store, idle = _idle_store(make_store, clock, {"Idle": 70})
    _sweep(idle)
    cq = store.queues.get("Idle", 1)
    assert cq is not None
    assert cq.closed
    assert (store.min_offset_in_queue("Idle", 1), store.max_offset_in_queue("Idle", 1)) == (0, 70)
    # What a long-polling consumer of an idle topic is answered: no new message, from memory.
    r = store.get_message("Idle", 1, 70, 32)
    assert (r.status, r.next_begin_offset, r.max_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 70, 70)
    # Single units are read with pread: offset queries leave the queue closed too.
    first = store.commit_log_offset_in_queue("Idle", 1, 0)
    record = store.read_record(first)
    assert record is not None
    assert decode_record(record).body == b"Idle-1-0"
    assert store.commit_log_offset_in_queue("Idle", 1, 69) > first
    assert store.commit_log_offset_in_queue("Idle", 1, 70) == -1
    assert store.offset_in_queue_by_time("Idle", 1, clock.now_ms + 10_000) == 70
    assert store.offset_in_queue_by_time("Idle", 1, 0) == 0
    assert cq.closed
    assert _mapped(_queue_dir(store, "Idle", 1)) == []


def test_a_pull_reopens_an_idle_queue_and_reads_every_message(make_store: MakeStore, clock: ManualClock) -> None:
    store, idle = _idle_store(make_store, clock, {"Idle": 150})
    assert _sweep(idle) == 2
    assert _bodies(store, "Idle", 0) == [f"Idle-0-{i}".encode() for i in range(150)]
    cq = store.queues.get("Idle", 0)
    assert cq is not None
    assert not cq.closed
    assert _mapped(_queue_dir(store, "Idle", 0))
    assert cq.touched, "a read counts as use"
    # Read since the sweep's last look: the next sweep does not close it again.
    assert _sweep(idle) == 0
    assert not cq.closed


@pytest.mark.parametrize("batch", [False, True])
def test_an_append_reopens_an_idle_queue_and_every_message_reads_back(
    make_store: MakeStore, clock: ManualClock, write_path: str, batch: bool
) -> None:
    store, idle = _idle_store(make_store, clock, {"Idle": 60})  # 60 + 10: across a file boundary
    assert _sweep(idle) == 2
    if batch:
        msgs = [Message("Idle", f"Idle-0-{i}".encode(), queue_id=0) for i in range(60, 70)]
        result = store.put_messages_blocking(msgs)
        assert result.status is PutMessageStatus.PUT_OK
    else:
        for i in range(60, 70):
            assert _put(store, "Idle", 0, f"Idle-0-{i}".encode()) == i
    cq = store.queues.get("Idle", 0)
    assert cq is not None
    assert not cq.closed
    assert store.max_offset_in_queue("Idle", 0) == 70
    assert _bodies(store, "Idle", 0) == [f"Idle-0-{i}".encode() for i in range(70)]
    assert _closed(store, "Idle", 1)
    # Used again, then idle again: closed again, and still whole.
    _sweep(idle)
    clock.advance(int(IDLE_S * 1000) + 1)
    assert _sweep(idle) == 1
    assert _closed(store, "Idle", 0)
    assert _mapped(_queue_dir(store, "Idle", 0)) == []
    assert _bodies(store, "Idle", 0) == [f"Idle-0-{i}".encode() for i in range(70)]


def test_a_queue_used_between_the_look_and_the_close_stays_open(make_store: MakeStore, clock: ManualClock) -> None:
    store, idle = _idle_store(make_store, clock, {"Idle": 5})
    found = asyncio.run(idle.candidates())
    assert len(found) == 2
    store.get_message("Idle", 0, 0, 1)  # a read of queue 0
    _put(store, "Idle", 1, b"a write to queue 1")
    assert idle.detach(found) == []
    assert not any(cq.closed for cq in found)


@pytest.mark.parametrize("crash", [False, True])
def test_a_restart_with_idle_queues_recovers_them_whole(
    make_store: MakeStore, clock: ManualClock, tmp_path: os.PathLike[str], crash: bool
) -> None:
    path = os.path.join(tmp_path, "restarted")
    if crash:
        # A process that closes its queues to idle and dies without a shutdown.
        out = run_store_script(
            """
            import asyncio, os, sys
            sys.path.insert(0, {root!r})
            from data_plane.store import Message, MessageStore
            from data_plane.store.idle_queues import IdleQueues
            from tests.conftest import ManualClock, small_config
            clock = ManualClock()
            store = MessageStore(small_config({path!r}), clock_ms=clock)
            store.start()
            for q in range(2):
                for i in range(150):
                    store.put_messages_blocking([Message("Idle", f"Idle-{{q}}-{{i}}".encode(), queue_id=q)])
            store.write_staged()  # (acknowledged: in the CommitLog file)
            idle = IdleQueues(store, 1.0)
            asyncio.run(idle.sweep())
            clock.advance(1001)
            print(asyncio.run(idle.sweep()), sum(cq.closed for cq in store.queues))
            os._exit(0)
            """,
            path=path,
        )
        assert out == ["2 2"]
    else:
        store, idle = _idle_store(make_store, clock, {"Idle": 150})
        assert _sweep(idle) == 2
        path = store.config.store_path
        store.shutdown()
    again = make_store(path)
    assert again.recovered_abnormally is crash
    for q in range(2):
        assert again.max_offset_in_queue("Idle", q) == 150
        assert _bodies(again, "Idle", q) == [f"Idle-{q}-{i}".encode() for i in range(150)]
    assert _put(again, "Idle", 0, b"after") == 150


def test_idle_queue_close_s_is_validated() -> None:
    with pytest.raises(ConfigError, match="idle_queue_close_s must be 0"):
        BrokerConfig(idle_queue_close_s=-1).validate()
    with pytest.raises(ConfigError, match="idle_queue_close_s"):
        BrokerConfig(idle_queue_close_s=0.01).validate()
    assert BrokerConfig().idle_queue_close_s == 86_400
    BrokerConfig(idle_queue_close_s=0).validate()
