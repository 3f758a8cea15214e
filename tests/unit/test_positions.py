"""The positions the append path moves on every message (positions.py): MappedFile and
ConsumeQueue hold them as C integers when the store is compiled, and a MappedFile keeps a view
of its mapping that the compiled appender writes ConsumeQueue units through."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, fastpath
from data_plane.store.consume_queue import CQ_UNIT_SIZE, ConsumeQueue
from data_plane.store.mapped_file import MappedFile
from data_plane.store.message import decode_record
from data_plane.store.positions import (
    FilePositions,
    PyFilePositions,
    PyQueuePositions,
    QueueOffsets,
    QueuePositions,
)
from tests.conftest import compiled_missing

FILE_FIELDS = (
    "wrote_position",
    "committed_position",
    "flushed_position",
    "file_size",
    "file_from_offset",
    "reserved_upto",
)


def _mapped(tmp_path: Path) -> MappedFile:
    return MappedFile(str(tmp_path / ("0" * 20)), 64 * 1024)


def test_the_compiled_bases_serve_when_the_store_is_compiled() -> None:
    if fastpath.speedups_module() is None:
        compiled_missing("the compiled store (data_plane.store._speedups)")
    assert FilePositions is not PyFilePositions
    assert QueuePositions is not PyQueuePositions
    assert issubclass(MappedFile, FilePositions)
    assert issubclass(ConsumeQueue, QueuePositions)
    assert QueueOffsets is not dict


@pytest.mark.parametrize("kind", [QueueOffsets, dict])
def test_queue_offsets_read_and_set_like_a_dict_of_ints(kind: type) -> None:
    offsets = kind()
    assert offsets.get(("T", 0), 0) == 0
    assert offsets.get(("T", 0)) is None
    assert ("T", 0) not in offsets
    with pytest.raises(KeyError):
        offsets[("T", 0)]
    offsets[("T", 0)] = 5
    offsets[("T", 1)] = 1 << 40
    offsets[("T", 0)] = 6  # set again: the same entry
    assert offsets[("T", 0)] == 6
    assert offsets.get(("T", 1), 0) == 1 << 40
    assert ("T", 1) in offsets
    assert len(offsets) == 2
    assert sorted(offsets) == [("T", 0), ("T", 1)]
    assert sorted(offsets.items()) == [(("T", 0), 6), (("T", 1), 1 << 40)]


def test_compiled_queue_offsets_refuse_what_a_queue_offset_cannot_be() -> None:
    if QueueOffsets is dict:
        compiled_missing("the compiled store (data_plane.store._speedups)")
    offsets = QueueOffsets()
    offsets[("T", 0)] = 3
    with pytest.raises(TypeError, match="not removed"):  # an appender may hold its cell
        del offsets[("T", 0)]
    with pytest.raises(ValueError, match="not negative"):
        offsets[("T", 0)] = -1
    with pytest.raises(TypeError):
        offsets[("T", 0)] = "4"  # type: ignore[assignment]
    with pytest.raises(OverflowError):
        offsets[("T", 0)] = 1 << 64
    assert offsets[("T", 0)] == 3  # unchanged by the refusals


def test_the_offset_the_appender_moves_is_the_one_python_reads(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    for i in range(3):
        result, _ = store.append([Message(topic="T", body=b"m%d" % i, queue_id=1)])
        assert result.ok, result
    assert store.commit_log.queue_offsets[("T", 1)] == 3  # moved by the appender, read from Python
    result, _ = store.append([Message(topic="T", body=b"m3", queue_id=1)])
    assert result.append is not None
    assert result.append.queue_offset == 3


@pytest.mark.parametrize("base", [FilePositions, PyFilePositions])
def test_file_positions_read_back_as_the_ints_written(base: type) -> None:
    class Sub(base):  # type: ignore[misc]
        __slots__ = ("other",)

    p = Sub()
    for i, name in enumerate(FILE_FIELDS):
        setattr(p, name, (1 << 40) + i)
    p.wrote_position += 5
    assert [getattr(p, n) for n in FILE_FIELDS] == [(1 << 40) + i + (5 if i == 0 else 0) for i in range(6)]
    assert all(type(getattr(p, n)) is int for n in FILE_FIELDS)
    assert not hasattr(p, "__dict__")


@pytest.mark.parametrize("base", [QueuePositions, PyQueuePositions])
def test_queue_positions_read_back_as_the_int_written(base: type) -> None:
    p = base()
    p.max_physic_offset = -1
    assert p.max_physic_offset == -1
    p.max_physic_offset = 1 << 50
    assert p.max_physic_offset == 1 << 50


def test_a_mapped_file_starts_at_zero_and_keeps_its_size_and_name(tmp_path: Path) -> None:
    mf = MappedFile(str(tmp_path / f"{4096:020d}"), 8192, reserve=False)
    try:
        assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (0, 0, 0)
        assert (mf.file_size, mf.file_from_offset, mf.reserved_upto) == (8192, 4096, 0)
    finally:
        assert mf.close()


def test_closing_lets_go_of_the_held_view_and_unmaps(tmp_path: Path) -> None:
    mf = _mapped(tmp_path)
    mf.mv[0:3] = b"abc"
    reader = mf.mv[0:3]  # a reader's slice keeps the mapping: close says "later"
    assert not mf.close()
    reader.release()
    assert mf.close()  # the held view does not keep it: close dropped it first
    with pytest.raises(ValueError, match="released"):
        mf.mv[0]


def test_units_go_through_the_held_view_and_without_it(make_store: Callable[..., MessageStore]) -> None:
    if QueuePositions is PyQueuePositions:
        compiled_missing("the compiled store (data_plane.store._speedups)")
    store = make_store(consume_queue_units_per_file=1000)

    def append(i: int) -> None:
        result, _ = store.append([Message(topic="T", body=b"m%d" % i, queue_id=3, properties={"KEYS": f"k{i}"})])
        assert result.ok, result

    for i in range(5):
        append(i)
    cq = store.queues.get("T", 3)
    assert cq is not None
    assert cq.last_file is not None
    assert cq.pending_units == 4  # (the first unit made the queue, on the Python path)
    assert not cq.last_file.drop_map()  # not under pending units
    cq.sync_units()
    assert cq.pending_units == 0
    assert cq.last_file.drop_map()  # the appender falls back to the file's memoryview
    for i in range(5, 10):
        append(i)
    assert cq.pending_units == 0
    cq.last_file.hold_map(cq.last_file.mv)
    for i in range(10, 15):
        append(i)
    assert cq.pending_units == 5
    assert cq.last_file.wrote_position == 10 * CQ_UNIT_SIZE
    cq.sync_units()
    assert cq.last_file.wrote_position == 15 * CQ_UNIT_SIZE
    assert cq.max_physic_offset == store.commit_log.mfq.max_offset()
    got = store.get_message("T", 3, 0, 32)
    assert got.status is GetMessageStatus.FOUND
    assert [decode_record(m).body for m in got.messages] == [b"m%d" % i for i in range(15)]
    assert store.max_offset_in_queue("T", 3) == 15


# Closing a ConsumeQueue file from inside an append (the store's clock is called while the
# appender writes through the file's held view; another thread may close the file at such a
# point): the view stays, the close says "later", the unit lands and reads back. Run apart: a
# regression is a write through an unmapped address, which would take the test run down.
CLOSE_DURING_APPEND = """
import sys
sys.path.insert(0, {root!r})
from data_plane.store import GetMessageStatus, Message, MessageStore
from data_plane.store.message import decode_record
from tests.conftest import small_config

store = None
closed = []

def clock():
    cq = store.queues.get("T", 0) if store is not None else None
    if cq is not None and cq.last_file is not None and not closed:
        closed.append(cq.last_file.close())
    return 1_700_000_000_000

store = MessageStore(small_config({path!r}), clock_ms=clock)
store.start()
for i in range(3):
    result, _ = store.append([Message(topic="T", body=b"m%d" % i, queue_id=0)])
    assert result.ok, result
cq = store.queues.get("T", 0)
got = store.get_message("T", 0, 0, 8)
print(closed, got.status.name, [decode_record(m).body for m in got.messages], cq.last_file.close())
"""


def test_a_file_closed_during_an_append_keeps_its_mapping_until_the_append_is_done(tmp_path: Path) -> None:
    if fastpath.speedups_module() is None:
        compiled_missing("the compiled store (data_plane.store._speedups)")
    root = str(Path(__file__).resolve().parents[2])
    script = CLOSE_DURING_APPEND.format(root=root, path=str(tmp_path / "store"))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    # the close inside the append said "later"; the units all landed; a close after it unmaps
    assert done.stdout.split() == ["[False]", "FOUND", "[b'm0',", "b'm1',", "b'm2']", "True"], done.stdout
