"""With the compiled store module, a started MessageStore's ``entry`` (its ``append`` and
``append_plain``) is the compiled entry points (``_speedups.StoreEntry``). They must answer
exactly what the Python methods (the reference) answer, count what they store, refuse what the store refuses, and hand
everything else to the Python path."""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.broker.send import PLAIN_BATCH_SKIP
from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, fastpath
from data_plane.store.message import decode_record
from tests.conftest import ManualClock, small_config

pytestmark = pytest.mark.skipif(fastpath.speedups_module() is None, reason="the compiled store module is not built")

BORN_HOST = bytes([10, 0, 0, 7, 0, 0, 0x27, 0x10])


def _random_batch(rng: random.Random, i: int) -> list[Message]:
    topic = rng.choice(["Orders", "tenant%Pay", "T"])
    queue_id = rng.choice([0, 1, 5, 70_000])
    kind = rng.random()
    props: dict[str, str] = {}
    if rng.random() < 0.7:
        props["TAGS"] = rng.choice(["TagA", "TagB"])
    if rng.random() < 0.5:
        props["KEYS"] = f"k{rng.randrange(50)}"
    if rng.random() < 0.1:
        props["é"] = "ü"  # not plain text: the Python record loop
    body = rng.randbytes(rng.choice([1, 17, 700, 3000]))
    if kind < 0.05:
        body = b""  # refused: no body
    elif kind < 0.08:
        body = bytes(20_000)  # refused: over max_message_size_bytes
    elif kind < 0.1:
        topic = "bad topic!"  # refused: the topic's characters
    n = rng.randint(2, 4) if kind > 0.85 else 1
    return [
        Message(topic=topic, body=body, queue_id=queue_id, properties=dict(props), born_host=BORN_HOST, flag=i)
        for _ in range(n)
    ]


def test_a_started_store_appends_through_the_compiled_entry_points(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    assert type(store.entry).__name__ == "StoreEntry"
    assert type(store.entry.append).__name__ == "builtin_function_or_method"
    assert type(store.entry.append_plain).__name__ == "builtin_function_or_method"


def test_the_entry_answers_what_the_reference_method_answers(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clocks = (ManualClock(), ManualClock())
    stores = [
        MessageStore(small_config(str(tmp_path / name), write_stage_bytes=ws), clock_ms=clock)
        for name, clock, ws in (("entry", clocks[0], 4096), ("reference", clocks[1], 4096))
    ]
    for s in stores:
        s.start()
    entry, reference = stores
    try:
        for i in range(600):
            msgs = _random_batch(rng, i)
            got, got_end = entry.entry.append(msgs)
            copies = [dataclasses.replace(m, properties=dict(m.properties)) for m in msgs]
            want, want_end = MessageStore.append(reference, copies)
            assert (got.status, got.reason, got_end) == (want.status, want.reason, want_end), (seed, i)
            if want.append is not None:
                assert got.append is not None
                g, w = got.append, want.append
                assert (g.wrote_offset, g.wrote_bytes, g.queue_offset, g.msg_id) == (
                    w.wrote_offset,
                    w.wrote_bytes,
                    w.queue_offset,
                    w.msg_id,
                ), (seed, i)
            step = rng.randrange(3)
            for c in clocks:
                c.advance(step)
        assert (entry.put_count, entry.put_bytes) == (reference.put_count, reference.put_bytes)
        assert entry.put_count > 400
        assert entry.max_phy_offset() == reference.max_phy_offset()
        for s in stores:
            s.write_staged()
        assert _log_bytes(entry) == _log_bytes(reference)
    finally:
        for s in stores:
            s.shutdown()


def _log_bytes(store: MessageStore) -> bytes:
    out = b""
    for mf in store.commit_log.mfq.files:
        out += bytes(mf.mv[: mf.wrote_position])
    return out


@pytest.mark.parametrize("state", ["disk_full", "dispatch_broken", "fenced", "stopped"])
def test_a_store_that_takes_no_writes_refuses_through_the_entry_with_nothing_written(
    make_store: Callable[..., MessageStore], state: str
) -> None:
    store = make_store()
    assert store.entry.append([Message("T", b"before", 0)])[0].ok
    before, count = store.max_phy_offset(), store.put_count
    if state == "stopped":
        store.shutdown()
    else:
        setattr(store, state, True)
    result, end = store.entry.append([Message("T", b"x", 0, born_host=BORN_HOST)])
    want = {
        "disk_full": PutMessageStatus.DISK_FULL,
        "dispatch_broken": PutMessageStatus.DISK_FULL,
        "fenced": PutMessageStatus.SERVICE_NOT_AVAILABLE,
        "stopped": PutMessageStatus.SERVICE_NOT_AVAILABLE,
    }[state]
    assert (result.status, end) == (want, -1)
    assert store.entry.append_plain("T", 0, b"x", b"", 0, 0, 1, BORN_HOST, 0, PLAIN_BATCH_SKIP) is None
    assert store.put_count == count
    if state != "stopped":
        assert store.max_phy_offset() == before
        setattr(store, state, False)
        assert store.entry.append([Message("T", b"after", 0)])[0].ok
        assert store.put_count == count + 1


def test_a_busy_commit_log_lock_sends_the_append_to_the_waiting_path(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(os_page_cache_busy_timeout_ms=20)
    lock = store.commit_log.lock
    assert lock.acquire()
    try:
        result, end = store.entry.append([Message("T", b"x", 0)])
        assert (result.status, end) == (PutMessageStatus.OS_PAGECACHE_BUSY, -1)
        assert store.entry.append_plain("T", 0, b"x", b"", 0, 0, 1, BORN_HOST, 0, PLAIN_BATCH_SKIP) is None
    finally:
        lock.release()
    assert store.entry.append([Message("T", b"x", 0)])[0].ok
    assert lock.acquire(False), "the entry left the lock held"
    lock.release()


def test_a_file_that_refuses_the_bytes_is_answered_with_the_io_refusal(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(write_stage_bytes=0)  # each single append writes its record at once
    assert store.entry.append([Message("T", b"first", 0)])[0].ok
    mf = store.commit_log.mfq.files[-1]
    before, count = store.max_phy_offset(), store.put_count
    good = mf._fd
    read_only = os.open(mf.path, os.O_RDONLY)
    mf._fd = read_only  # pwrite: EBADF
    try:
        result, end = store.entry.append([Message("T", b"second", 0)])
    finally:
        mf._fd = good
        os.close(read_only)
    assert (result.status, end) == (PutMessageStatus.CREATE_MAPPED_FILE_FAILED, -1)
    assert "Bad file descriptor" in result.reason
    assert (store.max_phy_offset(), store.put_count) == (before, count)
    assert store.commit_log.lock.acquire(False), "the entry left the lock held"
    store.commit_log.lock.release()
    assert store.entry.append([Message("T", b"third", 0)])[0].ok
    got = store.get_message("T", 0, 0, 8)
    assert got.status is GetMessageStatus.FOUND
    assert [decode_record(m).body for m in got.messages] == [b"first", b"third"]


def test_an_error_inside_the_append_propagates_and_releases_the_lock(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    with pytest.raises(TypeError, match="append_plain"):
        store.entry.append_plain("T", 0)  # type: ignore[call-arg]
    assert store.commit_log.lock.acquire(False)
    store.commit_log.lock.release()


def test_a_dropped_store_is_collected_with_its_entry(tmp_path: Path) -> None:
    store = MessageStore(small_config(str(tmp_path / "s")))
    store.start()
    store.entry.append([Message("T", b"x", 0)])
    store.shutdown()
    append = store.entry.append  # the entry point holds its store weakly
    ref = weakref.ref(store)
    del store
    gc.collect()
    assert ref() is None
    with pytest.raises(RuntimeError, match="gone"):
        append([Message("T", b"y", 0)])


def test_a_restarted_store_gets_a_new_entry_and_keeps_its_counts(tmp_path: Path) -> None:
    store = MessageStore(small_config(str(tmp_path / "s")))
    store.start()
    try:
        assert store.entry.append([Message("T", b"one", 0)])[0].ok
        first = store.entry
        store.shutdown()
        store.start()
        assert store.entry is not first
        assert store.entry.append([Message("T", b"two", 0)])[0].ok
        assert store.put_count == 2
        got = store.get_message("T", 0, 0, 8)
        assert [decode_record(m).body for m in got.messages] == [b"one", b"two"]
    finally:
        store.shutdown()
