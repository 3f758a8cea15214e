"""New ConsumeQueues made on disk ahead of their first unit, off the writer's thread: the
table's ``prepare``, the file it leaves for the first write, a restart that maps none of those
never written, and the store's QueuePreparer thread (queue_prepare.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.consume_queue import CQ_UNIT_SIZE
from data_plane.store.dispatcher import ConsumeQueueTable
from data_plane.store.mapped_file import offset_to_file_name
from data_plane.store.queue_prepare import QueuePreparer

UNITS_PER_FILE = 8
FIRST_FILE = offset_to_file_name(0)


@pytest.fixture
def table(tmp_path: Path) -> Iterator[ConsumeQueueTable]:
    t = ConsumeQueueTable(str(tmp_path / "consumequeue"), UNITS_PER_FILE)
    yield t
    t.close()


def made(table: ConsumeQueueTable, topic: str, queue_id: int) -> bool:
    return os.path.exists(os.path.join(table.root, topic, str(queue_id), FIRST_FILE))


def until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.005)


def test_a_prepared_queue_is_its_directory_and_sized_first_file_and_the_first_unit_goes_there(
    table: ConsumeQueueTable, tmp_path: Path
) -> None:
    assert table.prepare("T", 2)
    path = tmp_path / "consumequeue" / "T" / "2" / FIRST_FILE
    assert os.path.getsize(path) == UNITS_PER_FILE * CQ_UNIT_SIZE
    assert path.read_bytes() == bytes(UNITS_PER_FILE * CQ_UNIT_SIZE)  # no data written
    assert table.get("T", 2) is None  # no object, mapping or descriptor until a write
    inode = os.stat(path).st_ino
    cq = table.get_or_create("T", 2)
    assert cq.put(1000, 50, 7, 0)
    assert os.stat(path).st_ino == inode  # the file made ahead
    assert sorted(os.listdir(path.parent)) == [FIRST_FILE]
    assert (cq.unit(0), cq.max_offset_in_queue()) == ((1000, 50, 7), 1)


def test_prepare_leaves_a_queue_that_exists_or_has_a_directory_alone(table: ConsumeQueueTable, tmp_path: Path) -> None:
    cq = table.get_or_create("T", 0)
    assert cq.put(1000, 50, 7, 0)
    assert not table.prepare("T", 0)
    assert cq.unit(0) == (1000, 50, 7)
    os.makedirs(tmp_path / "consumequeue" / "T" / "5")  # a write making it, say
    assert not table.prepare("T", 5)
    assert os.listdir(tmp_path / "consumequeue" / "T" / "5") == []


def test_a_prepared_file_is_left_unused_when_the_queue_starts_past_it(table: ConsumeQueueTable) -> None:
    """A queue whose first unit is beyond its first file (a slave that started late; never a
    master's new queue) starts where its unit is, as without preparing."""
    assert table.prepare("T", 1)
    cq = table.get_or_create("T", 1)
    first_unit = 2 * UNITS_PER_FILE + 3
    assert cq.put(5000, 50, 7, first_unit)
    assert (cq.min_offset_in_queue(), cq.max_offset_in_queue(), cq.unit(first_unit)) == (
        first_unit,
        first_unit + 1,
        (5000, 50, 7),
    )


def test_a_restart_maps_no_queue_prepared_and_never_written(tmp_path: Path) -> None:
    root = str(tmp_path / "consumequeue")
    t = ConsumeQueueTable(root, UNITS_PER_FILE)
    assert t.prepare("T", 0)
    assert t.prepare("T", 1)
    assert t.get_or_create("T", 1).put(1000, 50, 7, 0)
    started_late = t.get_or_create("T", 2)  # its first file begins with hole units
    assert started_late.put(3000, 50, 7, 3)
    t.close()
    again = ConsumeQueueTable(root, UNITS_PER_FILE)
    again.load()
    assert sorted(again.queues) == [("T", 1), ("T", 2)]
    for cq in again.queues.values():
        cq.recover()
    assert again.get("T", 1).unit(0) == (1000, 50, 7)  # type: ignore[union-attr]
    assert again.get("T", 2).unit(3) == (3000, 50, 7)  # type: ignore[union-attr]
    cq = again.get_or_create("T", 0)  # its first write takes the file made before the restart
    cq.load()
    cq.recover()
    assert (cq.max_offset_in_queue(), cq.put(2000, 50, 7, 0), cq.unit(0)) == (0, True, (2000, 50, 7))
    again.close()


def test_the_writer_and_the_preparer_on_the_same_queues_lose_no_unit(table: ConsumeQueueTable) -> None:
    """Both race over the same 300 queues: whatever order they come in, every unit the writer
    put is there (the preparer writes no data into a file)."""
    keys = [("R", q) for q in range(300)]
    prepared: list[bool] = []

    def prepare_all() -> None:
        prepared.extend(table.prepare(t, q) for t, q in keys)

    th = threading.Thread(target=prepare_all)
    th.start()
    for n, (t, q) in enumerate(reversed(keys)):
        assert table.get_or_create(t, q).put(100 * n, 50, 0, 0)
    th.join()
    assert len(prepared) == len(keys)
    for n, (t, q) in enumerate(reversed(keys)):
        cq = table.get(t, q)
        assert cq is not None
        assert cq.unit(0) == (100 * n, 50, 0)
        assert os.path.getsize(os.path.join(table.root, t, str(q), FIRST_FILE)) == UNITS_PER_FILE * CQ_UNIT_SIZE


def test_the_preparer_thread_makes_every_queue_asked_for(table: ConsumeQueueTable) -> None:
    preparer = QueuePreparer(table)
    preparer.start()
    try:
        assert preparer.request("T", range(40))
        assert preparer.request("U", range(3))
        until(lambda: preparer.pending == 0, "the 43 queues prepared")
        assert preparer.prepared == 43
        assert all(made(table, "T", q) for q in range(40))
        assert not made(table, "T", 40)
        assert preparer.request("T", range(41))  # grown by one: only the new one is made
        until(lambda: preparer.pending == 0, "the 41st queue prepared")
        assert (preparer.prepared, made(table, "T", 40)) == (44, True)
    finally:
        preparer.stop()


def test_ready_is_done_once_every_request_of_the_topic_is_made(table: ConsumeQueueTable) -> None:
    preparer = QueuePreparer(table)
    assert preparer.ready("T") is None  # nothing asked
    assert preparer.request("T", range(20))
    assert preparer.request("T", range(20, 30))
    ready = preparer.ready("T")
    assert ready is not None
    assert not ready.done()  # not started: nothing made yet
    preparer.start()
    try:
        ready.result(timeout=10)
        assert all(made(table, "T", q) for q in range(30)), "both requests made first"
        assert preparer.ready("T") is None
    finally:
        preparer.stop()


def test_stopping_answers_whoever_waits_for_queues_not_made(table: ConsumeQueueTable) -> None:
    preparer = QueuePreparer(table)  # not started
    assert preparer.request("T", range(5))
    ready = preparer.ready("T")
    assert ready is not None
    preparer.stop()
    assert ready.done()
    assert preparer.pending == 0


def test_requests_past_the_cap_are_dropped_not_queued(table: ConsumeQueueTable) -> None:
    preparer = QueuePreparer(table, max_pending=10)  # not started: nothing is taken off
    assert preparer.request("T", range(8))
    assert not preparer.request("U", range(3))
    assert (preparer.pending, preparer.dropped) == (8, 3)


def test_the_store_prepares_a_topics_queues_and_its_messages_go_there(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    assert store.prepare_queues("P", 6)
    ready = store.queues_ready("P")
    assert ready is not None
    ready.result(timeout=10)
    assert all(made(store.queues, "P", q) for q in range(6))
    for q in range(6):
        result = store.put_messages_blocking([Message("P", b"m%d" % q, queue_id=q)])
        assert result.status is PutMessageStatus.PUT_OK, result
    for q in range(6):
        r = store.get_message("P", q, 0, 8)
        assert (r.status, r.message_count) == (GetMessageStatus.FOUND, 1)
        for m in r.messages:
            m.release()
