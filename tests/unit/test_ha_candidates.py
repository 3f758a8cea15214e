"""The handshake's candidates (``last_records``, ha/slave.py): walked from where the
ConsumeQueues say the newest records start, they are exactly what a walk of the whole last file
finds — with records that took no queue unit among them, a partial record at the end, a file
ending in its blank, and queues that name too few records."""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c

from data_plane.store import Message, MessageStore
from data_plane.store.ha.slave import last_records
from tests.ha_support import TOPICS, ha_config, log_bytes, make_message, put_many

LIMITS = (1, 7, 64, 1024)


def whole_file_walk(store: MessageStore, limit: int) -> list[tuple[int, int, int]]:
    """The candidates as a walk of the whole file holding the log's last byte finds them."""
    cl = store.commit_log
    if cl.max_offset() <= cl.min_offset():
        return []
    mf = cl.mfq.find_by_offset(cl.max_offset() - 1)
    assert mf is not None
    prev = max(mf.file_from_offset, cl.min_offset())
    spans: collections.deque[tuple[int, int]] = collections.deque(maxlen=limit)
    for end, _req in cl.scan(prev, check_crc=False):
        spans.append((prev, end - prev))
        prev = end
    out = []
    for offset, size in reversed(spans):
        data = cl.read(offset, size)
        assert data is not None
        out.append((offset, size, crc32c(data)))
    return out


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(ha_config(str(tmp_path / "s"), commit_log_file_size_bytes=4 * 1024 * 1024))
    s.start()
    yield s
    s.shutdown()


def assert_candidates(store: MessageStore) -> None:
    for limit in LIMITS:
        assert last_records(store, limit) == whole_file_walk(store, limit), limit


def test_the_candidates_are_those_a_walk_of_the_whole_file_finds(store: MessageStore, seed: int) -> None:
    rng = random.Random(seed)
    assert last_records(store) == []
    put_many(store, rng, 1500)
    assert_candidates(store)
    # The walk starts at the newest records the queues name, not at the file's start.
    floor = store.commit_log.mfq.files[-1].file_from_offset
    assert store.queues.newest_record_start(floor, 64) == last_records(store, 64)[-1][0] > floor
    # Prepared transaction records take no ConsumeQueue unit: among the newest, and all of them.
    for i in range(1500, 1530):
        msg = make_message(rng, i)
        if rng.random() < 0.5:
            msg.sys_flag = 1 << 2
        store.append([msg])
    assert_candidates(store)
    for i in range(2000):
        store.append([Message(TOPICS[0], b"half %d" % i, 0, sys_flag=1 << 2)])
    assert_candidates(store)


def test_the_candidates_of_a_slave_with_a_partial_record_or_a_full_file(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    master = MessageStore(ha_config(str(tmp_path / "m")))  # 256 KiB files
    master.start()
    try:
        put_many(master, rng, 700)
        data = log_bytes(master)
        file_size = master.commit_log.file_size
        for upto in (len(data) - rng.randint(1, 40), 2 * file_size, len(data)):
            slave = MessageStore(ha_config(str(tmp_path / f"s{upto}")))
            slave.start()
            try:
                slave.append_raw(data[:upto], 0)
                assert_candidates(slave)
                cands = last_records(slave)  # (none when the last file holds only a partial record)
                assert all(offset + size <= upto for offset, size, _crc in cands)
                if upto == 2 * file_size:  # the log ends with the second file's blank: a candidate
                    assert cands[0][0] + cands[0][1] == upto
            finally:
                slave.shutdown()
    finally:
        master.shutdown()
