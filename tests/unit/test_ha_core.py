"""The replication core without sockets: frame layouts, a slave's store fed the master's log in
arbitrary pieces (append_raw + dispatch), the divergence rule and truncation, wait_for_slave."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.store import Message, MessageStore, PutMessageStatus
from data_plane.store.ha import HAService
from data_plane.store.ha.protocol import (
    CANDIDATE,
    DATA_HEADER,
    HANDSHAKE_HEAD,
    HANDSHAKE_REPLY,
    MAGIC,
    REPLY_RETRY,
    REPLY_STREAM,
    REPORT,
    VERSION,
    encode_handshake,
)
from data_plane.store.ha.slave import last_records
from data_plane.store.message import decode_record
from tests.ha_support import TOPICS, assert_replica, ha_config, log_bytes, make_message, put_many, queue_contents


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[[str], MessageStore]]:
    made: list[MessageStore] = []

    def make(name: str) -> MessageStore:
        s = MessageStore(ha_config(str(tmp_path / name)))
        s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.shutdown()


@contextlib.contextmanager
def master_and_slave(tmp_path: Path) -> Iterator[tuple[MessageStore, MessageStore]]:
    """Two started stores, "m" and "s" under ``tmp_path``, shut down afterwards."""
    master = MessageStore(ha_config(str(tmp_path / "m")))
    master.start()
    slave = MessageStore(ha_config(str(tmp_path / "s")))
    slave.start()
    try:
        yield master, slave
    finally:
        master.shutdown()
        slave.shutdown()


def copy_log(master: MessageStore, slave: MessageStore, rng: random.Random, max_piece: int = 40_000) -> None:
    """What HAClient does with DATA frames, in random piece sizes (never crossing a file)."""
    cl = master.commit_log
    while slave.max_phy_offset() < master.max_phy_offset():
        at = slave.max_phy_offset() if slave.max_phy_offset() > slave.min_phy_offset() else cl.min_offset()
        at = max(at, slave.max_phy_offset())
        mf = cl.mfq.find_by_offset(at)
        assert mf is not None
        pos = at - mf.file_from_offset
        n = min(rng.randint(1, max_piece), mf.wrote_position - pos)
        assert slave.append_raw(bytes(mf.mv[pos : pos + n]), at) == at + n


def handshake(ha: HAService, slave: MessageStore, limit: int = 1024) -> tuple[int, int]:
    """What HAClient does on connect: offer its last records, truncate, until told to stream.
    Returns (rounds, the offset streaming starts at)."""
    rounds = 0
    while True:
        rounds += 1
        code, offset = ha.decide_start(slave.max_phy_offset(), last_records(slave, limit))
        slave.truncate_log(offset)
        if code == REPLY_STREAM:
            return rounds, offset


def test_frame_layouts() -> None:
    assert (HANDSHAKE_HEAD.size, CANDIDATE.size, HANDSHAKE_REPLY.size, REPORT.size, DATA_HEADER.size) == (
        24,
        16,
        28,
        8,
        12,
    )
    raw = encode_handshake(1234, [(1000, 234, 7), (900, 100, 8)], member_id=3)
    magic, version, member, top, count = HANDSHAKE_HEAD.unpack_from(raw)
    assert (magic, version, member, top, count) == (MAGIC, VERSION, 3, 1234, 2)
    assert CANDIDATE.unpack_from(raw, HANDSHAKE_HEAD.size + CANDIDATE.size) == (900, 100, 8)


def test_pieces_build_identical_log_and_indexes(stores: Callable[[str], MessageStore]) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    master, slave = stores("m"), stores("s")
    put_many(master, rng, 600)
    assert len(master.commit_log.mfq.files) > 2
    copy_log(master, slave, rng)
    assert_replica(master, slave, keys=("HaA#m-0", "HaB#m-301", "Ha_C#Um000000000599"))
    # ... and after a restart of the slave (recovery over the replicated log)
    slave.shutdown()
    slave.start()
    assert_replica(master, slave, keys=("HaA#m-3",))


def test_decide_start(stores: Callable[[str], MessageStore]) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    master, slave = stores("m"), stores("s")
    ha = HAService(master, port=0)
    assert ha.decide_start(0, []) == (REPLY_STREAM, 0)
    put_many(master, rng, 50)
    copy_log(master, slave, rng)
    top = master.max_phy_offset()
    assert ha.decide_start(top, last_records(slave)) == (REPLY_STREAM, top)
    # the slave is behind: it streams from its own end
    put_many(master, rng, 20, start=50)
    assert ha.decide_start(top, last_records(slave)) == (REPLY_STREAM, top)
    # the slave holds records the master never had: back to the common point
    put_many(slave, rng, 5, start=1000, tag="x")
    assert ha.decide_start(slave.max_phy_offset(), last_records(slave)) == (REPLY_STREAM, top)
    # nothing matches: walk back
    cands = [(c[0], c[1], c[2] ^ 1) for c in last_records(slave)]
    code, offset = ha.decide_start(slave.max_phy_offset(), cands)
    assert code == REPLY_RETRY
    assert offset == min(c[0] for c in cands)


def test_diverged_slave_truncates_and_converges(stores: Callable[[str], MessageStore]) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    master, slave = stores("m"), stores("s")
    put_many(master, rng, 200)
    copy_log(master, slave, rng)
    common = master.max_phy_offset()
    # after a failover: each side wrote records the other never saw
    put_many(master, rng, 150, start=200, tag="new")
    put_many(slave, rng, 120, start=200, tag="old")
    assert slave.max_phy_offset() != master.max_phy_offset()
    # Where the logs agree: to ``common``; or, when the first record each side wrote next did not
    # fit in the file ``common`` is in, to that file's end (both sealed it with the same blank).
    file_size = master.config.commit_log_file_size_bytes
    file_end = (common // file_size + 1) * file_size
    sealed_alike = all(s.look_message_by_offset(common) is None for s in (master, slave))  # a blank there
    agreed = {common, file_end} if sealed_alike else {common}
    ha = HAService(master, port=0)
    _rounds, offset = handshake(ha, slave)
    assert offset in agreed, (offset, agreed)
    assert slave.max_phy_offset() == offset
    assert slave.query_message("HaA", "old-201") == []
    copy_log(master, slave, rng)
    assert_replica(master, slave, keys=("HaA#new-201", "HaB#m-7"))
    slave.shutdown()
    slave.start()
    assert_replica(master, slave, keys=("HaA#new-201",))


def test_walk_back_through_retry(stores: Callable[[str], MessageStore]) -> None:
    """More diverged records than one handshake carries: RETRY until a candidate matches."""
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    master, slave = stores("m"), stores("s")
    put_many(master, rng, 30)
    copy_log(master, slave, rng)
    common = master.max_phy_offset()
    put_many(slave, rng, 40, start=30, tag="x")
    ha = HAService(master, port=0)
    rounds, offset = handshake(ha, slave, limit=7)
    assert offset == common
    assert rounds > 1
    assert log_bytes(slave) == log_bytes(master)


def test_empty_slave_starts_at_masters_first_file(stores: Callable[[str], MessageStore]) -> None:
    rng = random.Random(5)
    master, slave = stores("m"), stores("s")
    put_many(master, rng, 400)
    master.commit_log.mfq.delete_first_files(2)  # retention took the oldest files
    start = master.min_phy_offset()
    assert start > 0
    assert HAService(master, port=0).decide_start(0, []) == (REPLY_STREAM, start)
    copy_log(master, slave, rng)
    assert slave.min_phy_offset() == start
    assert log_bytes(slave) == log_bytes(master)


def test_wait_for_slave_resolves_on_ack_and_times_out(stores: Callable[[str], MessageStore]) -> None:
    master = stores("m")
    ha = HAService(master, port=0)

    async def go() -> None:
        waiters = [asyncio.create_task(ha.wait_for_slave(o, 5_000)) for o in (100, 200, 300)]
        late = asyncio.create_task(ha.wait_for_slave(10_000, 50))
        await asyncio.sleep(0)
        ha.on_ack(250)  # one ack resolves every waiter at or below it
        await asyncio.sleep(0)
        assert [w.done() for w in waiters] == [True, True, False]
        assert await late is False  # timed out
        ha.on_ack(300)
        assert await asyncio.gather(*waiters) == [True, True, True]
        assert await ha.wait_for_slave(120, 1) is True  # already acknowledged
        assert await ha.wait_for_slave(301, 30) is False
        assert not ha.is_slave_ok(0)  # nobody connected

    asyncio.run(go())


def test_a_promoted_slave_cuts_a_partial_record_before_writing(tmp_path: Path, seed: int) -> None:
    """A master that died mid-chunk leaves the slave's log ending inside a record: promotion cuts
    it back to the last whole record, so records written next survive a restart."""
    rng = random.Random(seed)
    with master_and_slave(tmp_path) as (master, slave):
        put_many(master, rng, 20)
        data = log_bytes(master)
        cut = len(data) - rng.randint(1, 40)  # inside the last record
        slave.append_raw(data[:cut], 0, dispatch=False)
        whole = slave.cut_partial_tail()
        assert whole < cut
        assert data[:whole] == log_bytes(slave)
        r, _end = slave.append([make_message(rng, 1000, "promoted")])
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append is not None
        assert r.append.wrote_offset == whole
    again = MessageStore(ha_config(str(tmp_path / "s")))
    again.start()
    try:
        found = [m for topic in TOPICS for m in again.query_message(topic, "promoted-1000")]
        assert len(found) == 1  # recovered, not cut away as a torn tail
        assert again.max_phy_offset() > whole
    finally:
        again.shutdown()


@pytest.mark.parametrize("tail", ["whole records", "a partial record"])
def test_a_promoted_slave_continues_every_queue_where_the_master_left_it(tmp_path: Path, seed: int, tail: str) -> None:
    """The slave's records came as raw bytes, which built its ConsumeQueues but never passed the
    CommitLog's own queue offset assignment. Promoted, its first append to a queue must take
    that queue's next offset — not 0, which collided with a replicated unit and left the new
    message acknowledged (SEND_OK) but out of reach of every consumer (found by the ASYNC_MASTER
    failover test in CI)."""
    rng = random.Random(seed)
    with master_and_slave(tmp_path) as (master, slave):
        put_many(master, rng, 60)
        data = log_bytes(master)
        cut = len(data) if tail == "whole records" else len(data) - rng.randint(1, 40)
        slave.append_raw(data[:cut], 0, dispatch=False)
        slave.cut_partial_tail()
        before = queue_contents(slave)
        for i, (topic, queue_id) in enumerate(sorted(before)):
            body = b"after promotion %d" % i
            r, _end = slave.append([Message(topic, body, queue_id)])
            assert r.status is PutMessageStatus.PUT_OK, (seed, r)
            assert r.append is not None
            assert r.append.queue_offset == len(before[(topic, queue_id)]), (seed, topic, queue_id)
            got = slave.get_message(topic, queue_id, r.append.queue_offset, 1)
            assert [decode_record(m).body for m in got.messages] == [body], (seed, topic, queue_id)
            for m in got.messages:
                m.release()
        after = queue_contents(slave)
        assert all(after[key][: len(units)] == units for key, units in before.items())


def test_a_fenced_store_refuses_every_writer_but_replication(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = MessageStore(ha_config(str(tmp_path / "f")))
    store.start()
    try:
        store.fenced = True
        r, end = store.append([make_message(rng, 1)])
        assert (r.status, end) == (PutMessageStatus.SERVICE_NOT_AVAILABLE, -1)
        assert "fenced" in r.reason
        source = MessageStore(ha_config(str(tmp_path / "src")))
        source.start()
        try:
            put_many(source, rng, 3)
            assert store.append_raw(log_bytes(source), 0) == source.max_phy_offset()
        finally:
            source.shutdown()
        store.fenced = False
        assert store.append([make_message(rng, 2)])[0].status is PutMessageStatus.PUT_OK
    finally:
        store.shutdown()
