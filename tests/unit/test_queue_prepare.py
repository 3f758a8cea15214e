"""New ConsumeQueues made ahead of their first unit, off the writer's thread: the table's
``prepare``, the file it leaves for the first write, and the store's QueuePreparer thread
(queue_prepare.py)."""

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


def until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.005)


def test_a_prepared_queue_has_its_first_file_made_and_the_first_unit_goes_into_it(
    table: ConsumeQueueTable, tmp_path: Path
) -> None:
    assert table.prepare("T", 2)
    cq = table.get("T", 2)
    assert cq is not None
    made = cq.mfq.prepared
    assert made is not None
    assert os.path.getsize(tmp_path / "consumequeue" / "T" / "2" / FIRST_FILE) == UNITS_PER_FILE * CQ_UNIT_SIZE
    assert (cq.min_offset_in_queue(), cq.max_offset_in_queue(), cq.unit(0)) == (0, 0, None)  # still empty
    assert table.get_or_create("T", 2) is cq
    assert cq.put(1000, 50, 7, 0)
    assert cq.mfq.files == [made]  # the file made ahead, not another
    assert cq.mfq.prepared is None
    assert (cq.unit(0), cq.max_offset_in_queue()) == ((1000, 50, 7), 1)


def test_prepare_leaves_a_queue_that_exists_or_has_files_alone(table: ConsumeQueueTable, tmp_path: Path) -> None:
    cq = table.get_or_create("T", 0)
    assert cq.put(1000, 50, 7, 0)
    assert not table.prepare("T", 0)
    assert table.get("T", 0) is cq
    os.makedirs(tmp_path / "consumequeue" / "T" / "5")  # on disk but not in the table
    assert not table.prepare("T", 5)
    assert table.get("T", 5) is None


def test_a_prepared_file_is_dropped_when_the_queue_starts_past_it(table: ConsumeQueueTable, tmp_path: Path) -> None:
    """A queue whose first unit is beyond its first file (a slave that started late; never a
    master's new queue) does not keep the file made for offset 0."""
    assert table.prepare("T", 1)
    cq = table.get("T", 1)
    assert cq is not None
    first_unit = 2 * UNITS_PER_FILE + 3
    assert cq.put(5000, 50, 7, first_unit)
    qdir = tmp_path / "consumequeue" / "T" / "1"
    assert sorted(os.listdir(qdir)) == [offset_to_file_name(2 * UNITS_PER_FILE * CQ_UNIT_SIZE)]
    assert (cq.min_offset_in_queue(), cq.max_offset_in_queue(), cq.unit(first_unit)) == (
        first_unit,
        first_unit + 1,
        (5000, 50, 7),
    )


def test_a_prepared_queue_never_written_reloads_as_an_empty_queue(tmp_path: Path) -> None:
    root = str(tmp_path / "consumequeue")
    t = ConsumeQueueTable(root, UNITS_PER_FILE)
    assert t.prepare("T", 0)
    t.close()
    again = ConsumeQueueTable(root, UNITS_PER_FILE)
    again.load()
    cq = again.get("T", 0)
    assert cq is not None
    cq.recover()
    assert (cq.min_offset_in_queue(), cq.max_offset_in_queue(), cq.unit(0)) == (0, 0, None)
    assert cq.put(1000, 50, 7, 0)
    assert cq.unit(0) == (1000, 50, 7)
    again.close()


def test_the_writer_and_the_preparer_never_make_one_queue_twice(table: ConsumeQueueTable) -> None:
    """Both sides race over the same 300 queues; each queue is one object, and every unit the
    writer put is there."""
    keys = [("R", q) for q in range(300)]
    prepared: list[bool] = []

    def prepare_all() -> None:
        prepared.extend(table.prepare(t, q) for t, q in keys)

    th = threading.Thread(target=prepare_all)
    th.start()
    seen = {}
    for n, (t, q) in enumerate(reversed(keys)):
        cq = table.get_or_create(t, q)
        seen[(t, q)] = cq
        assert cq.put(100 * n, 50, 0, 0)
    th.join()
    assert all(table.get(t, q) is seen[(t, q)] for t, q in keys)
    assert all(seen[k].unit(0) == (100 * n, 50, 0) for n, k in enumerate(reversed(keys)))
    assert len(prepared) == len(keys)


def test_the_preparer_thread_makes_every_queue_asked_for(table: ConsumeQueueTable) -> None:
    preparer = QueuePreparer(table)
    preparer.start()
    try:
        assert preparer.request("T", range(40))
        assert preparer.request("U", range(3))
        until(lambda: preparer.pending == 0, "the 43 queues prepared")
        assert preparer.prepared == 43
        assert all(table.get("T", q) is not None for q in range(40))
        assert table.get("T", 40) is None
        assert preparer.request("T", range(41))  # grown by one: only the new one is made
        until(lambda: preparer.pending == 0, "the 41st queue prepared")
        assert (preparer.prepared, table.get("T", 40) is not None) == (44, True)
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
        assert all(table.get("T", q) is not None for q in range(30)), "both requests made first"
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
    until(lambda: all(store.queues.get("P", q) is not None for q in range(6)), "six queues prepared")
    made = {q: store.queues.get("P", q).mfq.prepared for q in range(6)}  # type: ignore[union-attr]
    assert all(mf is not None for mf in made.values())
    for q in range(6):
        result = store.put_messages_blocking([Message("P", b"m%d" % q, queue_id=q)])
        assert result.status is PutMessageStatus.PUT_OK, result
    for q in range(6):
        cq = store.queues.get("P", q)
        assert cq is not None
        assert cq.mfq.files == [made[q]]
        r = store.get_message("P", q, 0, 8)
        assert (r.status, r.message_count) == (GetMessageStatus.FOUND, 1)
        for m in r.messages:
            m.release()
