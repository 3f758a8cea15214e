"""The compiled appender keeps a ConsumeQueue's newest units pending in the queue object and
writes them to the file up to eight at a time (``positions.py``). Nothing that reads or changes a
queue may miss them, a flush round's checkpoint may not claim them, and a process killed with
units pending loses nothing that recovery cannot rebuild from the CommitLog."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore
from data_plane.store.consume_queue import CQ_UNIT_SIZE, ConsumeQueue
from data_plane.store.message import decode_record
from tests.conftest import NO_COMPILED_TWINS, ManualClock, run_store_script, small_config

# Where the compiled twins are expected and missing, these fail (test_compiled_twins.py says why).
pytestmark = pytest.mark.skipif(NO_COMPILED_TWINS, reason="the compiled twins are off or cannot be built here")

BIG_QUEUES = {"consume_queue_units_per_file": 1000}


def _append(store: MessageStore, queue_id: int, body: bytes) -> None:
    result, _ = store.append([Message(topic="T", body=body, queue_id=queue_id, properties={"TAGS": "a"})])
    assert result.ok, result


def _cq(store: MessageStore, queue_id: int) -> ConsumeQueue:
    cq = store.queues.get("T", queue_id)
    assert cq is not None
    return cq


def _read_queue(store: MessageStore, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    while True:
        got = store.get_message("T", queue_id, len(out), 32)
        if got.status is not GetMessageStatus.FOUND:
            return out
        assert got.queue_offsets == list(range(len(out), len(out) + len(got.messages)))
        out += [decode_record(m).body for m in got.messages]


def _file_units(cq: ConsumeQueue) -> int:
    mf = cq.last_file
    assert mf is not None
    return (mf.file_from_offset + mf.wrote_position) // CQ_UNIT_SIZE


def test_units_pend_up_to_eight_and_then_go_to_the_file(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(**BIG_QUEUES)
    _append(store, 0, b"first")  # a new queue: the Python path writes its unit
    cq = _cq(store, 0)
    seen = []
    for i in range(1, 30):
        _append(store, 0, b"m%d" % i)
        seen.append(cq.pending_units)
        assert _file_units(cq) + cq.pending_units == i + 1
    assert max(seen) == 8
    assert min(seen) >= 1
    assert _read_queue(store, 0) == [b"first"] + [b"m%d" % i for i in range(1, 30)]
    assert cq.pending_units == 0


READERS: dict[str, Callable[[MessageStore], object]] = {
    "get_message": lambda s: s.get_message("T", 0, 0, 32).status,
    "max_offset_in_queue": lambda s: s.max_offset_in_queue("T", 0),
    "offset_by_time": lambda s: s.offset_in_queue_by_time("T", 0, 0),
    "flush round": lambda s: s.flush_indexes(False),
    "thorough flush round": lambda s: s.flush_indexes(True),
    "a batch to the queue": lambda s: s.append([Message("T", b"b1", 0), Message("T", b"b2", 0)]),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_whatever_reads_or_writes_the_queue_writes_its_pending_units_first(
    make_store: Callable[..., MessageStore], reader: str
) -> None:
    store = make_store(**BIG_QUEUES)
    for i in range(6):
        _append(store, 0, b"m%d" % i)
    cq = _cq(store, 0)
    assert cq.pending_units == 5
    READERS[reader](store)
    assert cq.pending_units == 0
    assert _file_units(cq) >= 6
    assert _read_queue(store, 0)[:6] == [b"m%d" % i for i in range(6)]
    assert store.max_offset_in_queue("T", 0) == (8 if reader == "a batch to the queue" else 6)


def test_a_sync_while_an_append_runs_python_code_loses_no_unit(tmp_path: Path, seed: int) -> None:
    """The store's clock runs inside the append, after the appender looked at the queue's
    pending units: write them out there (as another thread may), often, at random."""
    rng = random.Random(seed)
    manual = ManualClock()
    store: MessageStore | None = None

    def clock() -> int:
        if store is not None and rng.random() < 0.3:
            for cq in list(store.queues):
                cq.sync_units()
        return manual()

    store = MessageStore(small_config(str(tmp_path / "s"), **BIG_QUEUES), clock_ms=clock)
    store.start()
    try:
        sent: dict[int, list[bytes]] = {q: [] for q in range(5)}
        for i in range(2000):
            q = rng.randrange(5)
            body = b"q%d/%d" % (q, i)
            _append(store, q, body)
            sent[q].append(body)
        for q, bodies in sent.items():
            assert _read_queue(store, q) == bodies, (seed, q)
    finally:
        store.shutdown()


KILLED_WITH_UNITS_PENDING = """
import os, random, sys
sys.path.insert(0, {root!r})
from data_plane.store import Message, MessageStore
from tests.conftest import small_config

rng = random.Random({seed})
KEYS = lambda i: {{"KEYS": "k%d" % i}}  # (indexed: recovery then starts from the checkpoint, not the log's start)
store = MessageStore(small_config({path!r}, consume_queue_units_per_file=1000, flush_interval_consume_queue_ms=20))
store.start()
for i in range(3000):
    q = rng.randrange(40)
    result, _ = store.append([Message(topic="T", body=b"q%d/%d" % (q, i), queue_id=q, properties=KEYS(i))])
    assert result.ok, result
    print(q, i)
    if rng.random() < 0.002:
        store.flush_indexes(False)
# A round with the log flushed: the checkpoint then lies at the log's end, past units that were
# pending until the round wrote them out. Then more, left pending.
store.commit_log.mfq.flush_all()
store.flush_indexes(True)
assert store.checkpoint.min_offset() == store.commit_log.max_offset()
for i in range(3000, 3100):
    q = rng.randrange(40)
    result, _ = store.append([Message(topic="T", body=b"q%d/%d" % (q, i), queue_id=q, properties=KEYS(i))])
    assert result.ok, result
    print(q, i)
pending = sum(cq.pending_units for cq in store.queues)
assert pending > 0, pending
store.write_staged()  # the records reach the file (a broker does this before it answers)
sys.stdout.flush()
os._exit(0)  # no shutdown: the pending units die with the process
"""


def test_units_pending_when_the_process_dies_are_rebuilt_by_recovery(tmp_path: Path, seed: int) -> None:
    path = str(tmp_path / "store")
    sent: dict[int, list[bytes]] = {}
    for line in run_store_script(KILLED_WITH_UNITS_PENDING, path=path, seed=seed):
        q, i = map(int, line.split())
        sent.setdefault(q, []).append(b"q%d/%d" % (q, i))
    store = MessageStore(small_config(path, consume_queue_units_per_file=1000))
    store.start()
    try:
        assert store.recovered_abnormally
        for q, bodies in sent.items():
            assert _read_queue(store, q) == bodies, (seed, q)
    finally:
        store.shutdown()
