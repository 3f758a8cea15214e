"""Staged single appends (StoreConfig.write_stage_bytes): single messages gather in the compiled
appender's stage and reach the CommitLog file in one pwrite; every reader, flush, rollover and
other writer writes them first, so nobody sees a message its ConsumeQueue names but the file
lacks."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, fastpath
from data_plane.store.message import decode_record

pytestmark = pytest.mark.skipif(not fastpath.COMPILED, reason="staging lives in the compiled appender")

QUIET = {"flush_interval_commit_log_ms": 60_000, "flush_commit_log_thorough_interval_ms": 60_000}


def _file_bytes(store: MessageStore, offset: int, size: int) -> bytes:
    """What the CommitLog file itself holds at a log offset (not the process's view)."""
    mf = store.commit_log.mfq.files[-1]
    with open(mf.path, "rb") as f:
        return os.pread(f.fileno(), size, offset - mf.file_from_offset)


def _prime(store: MessageStore, topic: str, queue_id: int) -> None:
    """The first message of a queue takes the Python path (it creates the ConsumeQueue)."""
    r, _ = store.append([Message(topic=topic, body=b"first", queue_id=queue_id)])
    assert r.status is PutMessageStatus.PUT_OK


def test_single_appends_are_staged_then_read_back_whole(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(**QUIET)
    _prime(store, "T", 0)
    bodies = [f"body-{i}".encode() * 20 for i in range(10)]
    offsets = []
    for b in bodies:
        r, end = store.append([Message(topic="T", body=b, queue_id=0, properties={"KEYS": "k"})])
        assert r.status is PutMessageStatus.PUT_OK
        assert end > 0
        assert r.append is not None
        offsets.append(r.append.wrote_offset)
    assert store._appender.staged > 0
    # Not in the file yet: the stage holds them.
    assert bodies[-1] not in _file_bytes(store, offsets[-1], 400)
    got = store.get_message("T", 0, 1, 32)
    assert got.status is GetMessageStatus.FOUND
    assert [decode_record(m).body for m in got.messages] == bodies
    assert [decode_record(m).commit_log_offset for m in got.messages] == offsets
    for m in got.messages:
        m.release()
    # The read wrote them; the file now has every byte.
    assert store._appender.staged == 0
    assert bodies[-1] in _file_bytes(store, offsets[-1], 400)


def test_the_stage_is_written_once_it_holds_write_stage_bytes(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(write_stage_bytes=4096, **QUIET)
    _prime(store, "T", 0)
    seen = []
    for i in range(40):
        store.append([Message(topic="T", body=bytes([65 + i % 26]) * 500, queue_id=0)])
        seen.append(store._appender.staged)
    assert min(seen) > 0  # every append went to the stage
    assert max(seen) < 4096 + 700  # written once it reached the threshold: never more than one record past it
    assert any(b < a for a, b in itertools.pairwise(seen))  # and it was written
    # Written at the threshold, with no reader asking: the file holds the early records.
    assert store.commit_log.mfq.files[-1].wrote_position > 4096


def test_a_batch_after_staged_singles_lands_after_them(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(**QUIET)
    _prime(store, "T", 0)
    for i in range(5):
        store.append([Message(topic="T", body=f"single-{i}".encode(), queue_id=0)])
    batch = [Message(topic="T", body=f"batch-{i}".encode(), queue_id=0) for i in range(3)]
    r, _ = store.append(batch)
    assert r.status is PutMessageStatus.PUT_OK
    got = store.get_message("T", 0, 0, 32)
    records = [decode_record(m) for m in got.messages]
    assert [x.body for x in records] == [b"first"] + [f"single-{i}".encode() for i in range(5)] + [
        f"batch-{i}".encode() for i in range(3)
    ]
    assert [x.queue_offset for x in records] == list(range(9))
    phys = [x.commit_log_offset for x in records]
    assert phys == sorted(phys)
    assert len(set(phys)) == 9
    for m in got.messages:
        m.release()


def test_a_flush_writes_the_stage_first(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(**QUIET)
    _prime(store, "T", 0)
    end = 0
    for _ in range(8):
        _, end = store.append([Message(topic="T", body=b"x" * 300, queue_id=0)])
    assert store._appender.staged > 0
    store.commit_log.mfq.flush_all()
    assert store._appender.staged == 0
    assert store.commit_log.mfq.flushed_where == end


def test_staged_records_survive_a_clean_restart(make_store: Callable[..., MessageStore], tmp_path: object) -> None:
    store = make_store(**QUIET)
    _prime(store, "T", 0)
    for i in range(6):
        store.append([Message(topic="T", body=f"m{i}".encode(), queue_id=0)])
    assert store._appender.staged > 0
    path = store.config.store_path
    store.shutdown()
    again = make_store(path, **QUIET)
    got = again.get_message("T", 0, 0, 32)
    assert [decode_record(m).body for m in got.messages] == [b"first"] + [f"m{i}".encode() for i in range(6)]
    for m in got.messages:
        m.release()


def test_with_no_stage_each_single_append_reaches_the_file(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(write_stage_bytes=0, **QUIET)
    _prime(store, "T", 0)
    r, _ = store.append([Message(topic="T", body=b"straight-to-the-file", queue_id=0)])
    assert r.append is not None
    assert store._appender.staged == 0
    assert b"straight-to-the-file" in _file_bytes(store, r.append.wrote_offset, 200)
