"""A running store's cut of its log (truncation.py): ``MessageStore.cut_log`` moves the end back
in memory, in proportion to what is cut, and ``LogCut.finish`` does the disk work; readers in
between see the cut log; a restart recovers exactly what the cut kept."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from data_plane.store import Message, MessageStore, PutMessageStatus
from data_plane.store.message import decode_record
from tests.ha_support import TOPICS, ha_config, make_message, queue_contents

GIB = 1024 * 1024 * 1024


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


def _append(store: MessageStore, msg: Message) -> int:
    """The CommitLog offset the message was stored at."""
    r, _end = store.append([msg])
    assert r.status is PutMessageStatus.PUT_OK, r
    assert r.append is not None
    return r.append.wrote_offset


def _found(store: MessageStore, key: str) -> bool:
    return any(m for topic in TOPICS for m in store.query_message(topic, key))


def test_cutting_a_few_records_off_a_1_gib_file_costs_what_is_cut_not_the_file(root: Path, seed: int) -> None:
    """The old cut read the rest of the file (a GiB) on the caller's thread, seconds of it; this one
    touches what it cuts: the loop's part in memory, the wipe over the cut bytes only."""
    rng = random.Random(seed)
    config = ha_config(str(root), commit_log_file_size_bytes=GIB)
    store = MessageStore(config)
    store.start()
    try:
        starts = [_append(store, make_message(rng, i)) for i in range(300)]
        before = queue_contents(store)
        old_end = store.max_phy_offset()
        units_end = {(cq.topic, cq.queue_id): cq.mfq.max_offset() for cq in store.queues}
        cut = starts[-10]  # the ten newest records go
        started = time.perf_counter()
        pending = store.cut_log(cut)
        on_loop_ms = (time.perf_counter() - started) * 1000
        assert pending is not None
        assert on_loop_ms < 100, on_loop_ms
        assert pending.tail.wipe is not None
        mf, wipe_from, wipe_to = pending.tail.wipe
        assert (mf.file_size, wipe_from, wipe_to) == (GIB, cut, old_end)  # the cut's bytes, not the GiB
        # Readers in between see the cut log already.
        assert store.max_phy_offset() == cut
        assert store.read_record(starts[-1]) is None
        assert not _found(store, "m-299")
        assert _found(store, "m-289")
        pending.finish()
        with open(mf.path, "rb") as f:
            f.seek(cut)
            assert f.read(old_end - cut) == bytes(old_end - cut)
        assert bytes(mf.mv[cut:old_end]) == bytes(old_end - cut)
        for cq in store.queues:  # the units dropped are zeros on disk too
            last = cq.mfq.last
            assert last is not None
            with open(last.path, "rb") as f:
                f.seek(last.wrote_position)
                dropped = units_end[(cq.topic, cq.queue_id)] - cq.mfq.max_offset()
                assert f.read(dropped) == bytes(dropped)
        after = queue_contents(store)
        assert after == {key: [u for u in units if u[0] < cut] for key, units in before.items()}
        new_at = _append(store, Message(TOPICS[0], b"after the cut", 0, properties={"KEYS": "after-cut"}))
        assert new_at == cut
        end = store.max_phy_offset()
    finally:
        store.shutdown()
    again = MessageStore(config)
    again.start()
    try:
        assert again.max_phy_offset() == end
        assert _found(again, "after-cut")
        assert not _found(again, "m-295")
        assert _found(again, "m-289")
        recovered = queue_contents(again)
        assert recovered[(TOPICS[0], 0)][-1] == (cut, b"after the cut")
        assert {k: [u for u in v if u[0] < cut] for k, v in recovered.items()} == after
    finally:
        again.shutdown()


def test_a_cut_across_files_deletes_the_later_ones_with_its_disk_work(root: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = MessageStore(ha_config(str(root)))  # 256 KiB files
    store.start()
    try:
        starts = [_append(store, make_message(rng, i)) for i in range(400)]
        files = store.commit_log.mfq.files
        assert len(files) >= 3
        first_of_second = next(s for s in starts if s >= files[1].file_from_offset)
        cut = starts[starts.index(first_of_second) - 3]  # three records before the second file
        later = [mf.path for mf in files[1:]]
        pending = store.cut_log(cut)
        assert pending is not None
        assert [mf.file_from_offset for mf in store.commit_log.mfq.files] == [files[0].file_from_offset]
        assert all(os.path.exists(p) for p in later)  # deleted by the disk work, not on the caller's thread
        assert store.read_record(first_of_second) is None
        pending.finish()
        assert not any(os.path.exists(p) for p in later)
        assert store.max_phy_offset() == cut
        got = store.get_message(TOPICS[0], 0, 0, 10_000)
        assert all(decode_record(m).commit_log_offset < cut for m in got.messages)
        for m in got.messages:
            m.release()
        assert store.cut_log(cut) is None  # the log ends there already
    finally:
        store.shutdown()


def test_a_cut_of_records_that_took_no_queue_unit_keeps_every_queue(root: Path, seed: int) -> None:
    """Prepared transaction records take no ConsumeQueue unit: cutting only those leaves the queues
    as they were, and their next offsets too."""
    rng = random.Random(seed)
    store = MessageStore(ha_config(str(root)))
    store.start()
    try:
        for i in range(50):
            _append(store, make_message(rng, i))
        before = queue_contents(store)
        prepared = [Message(TOPICS[1], b"half %d" % i, 1, sys_flag=1 << 2) for i in range(5)]
        cut = _append(store, prepared[0])
        for msg in prepared[1:]:
            _append(store, msg)
        store.truncate_log(cut)
        assert store.max_phy_offset() == cut
        assert queue_contents(store) == before
        r, _end = store.append([Message(TOPICS[1], b"next", 1)])
        assert r.append is not None
        assert r.append.queue_offset == len(before[(TOPICS[1], 1)])
    finally:
        store.shutdown()
