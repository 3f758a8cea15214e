"""Reserving ConsumeQueue and IndexFile blocks ahead of the writer (StoreConfig.
reserve_indexes_ahead_s): the flush thread reserves what a busy queue and the newest IndexFile will
take next, so the appends that follow find their blocks reserved and reserve nothing themselves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from data_plane.store import GetMessageStatus, Message, MessageStore
from data_plane.store.consume_queue import CQ_UNIT_SIZE, ConsumeQueue
from data_plane.store.index_file import ENTRY_RESERVE_BYTES, INDEX_ENTRY_SIZE, IndexFile
from data_plane.store.message import decode_record
from tests.conftest import until

# The flush thread's first round comes a minute after start: the tests call the round's
# reservation themselves, and one round's worth (rounds = 60 s / 60 s = 1) is what they expect.
BY_HAND = {
    "flush_interval_consume_queue_ms": 60_000,
    "reserve_indexes_ahead_s": 60.0,
    "consume_queue_units_per_file": 50_000,
    "index_max_entries": 100_000,
}


def _append(store: MessageStore, n: int, start: int = 0, queue_id: int = 0) -> None:
    for i in range(start, start + n):
        result, _ = store.append([Message(topic="T", body=b"x" * 100, queue_id=queue_id, properties={"KEYS": f"k{i}"})])
        assert result.ok, result


def _cq(store: MessageStore, queue_id: int = 0) -> ConsumeQueue:
    cq = store.queues.get("T", queue_id)
    assert cq is not None
    assert cq.last_file is not None
    return cq


def test_a_busy_queue_gets_a_rounds_worth_of_its_rate_reserved_and_its_next_appends_reserve_nothing(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(**BY_HAND)
    _append(store, 300)
    mf = _cq(store).last_file
    assert mf is not None
    store.reserve_indexes_ahead(list(store.queues))  # moved 300 units since the queue began
    assert mf.reserved_upto >= 600 * CQ_UNIT_SIZE
    reserved = mf.reserved_upto
    _append(store, 300, start=300)
    _cq(store).sync_units()  # (the appender's pending units to the file)
    assert mf.wrote_position == 600 * CQ_UNIT_SIZE
    assert mf.reserved_upto == reserved  # the appends found their blocks reserved
    got = store.get_message("T", 0, 599, 1)
    assert got.status is GetMessageStatus.FOUND
    assert decode_record(got.messages[0]).keys == ["k599"]


def test_an_idle_queue_is_left_alone(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(**BY_HAND)
    _append(store, 50, queue_id=0)
    _append(store, 50, queue_id=1)
    store.reserve_indexes_ahead(list(store.queues))
    _append(store, 200, start=50, queue_id=0)
    idle = _cq(store, 1).last_file
    assert idle is not None
    before = idle.reserved_upto
    store.reserve_indexes_ahead(list(store.queues))
    assert idle.reserved_upto == before  # queue 1 took nothing since the last round
    busy = _cq(store, 0).last_file
    assert busy is not None
    assert busy.reserved_upto >= busy.wrote_position + 200 * CQ_UNIT_SIZE


def test_with_the_setting_at_zero_the_flush_round_reserves_nothing(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(**{**BY_HAND, "reserve_indexes_ahead_s": 0.0})
    _append(store, 300)
    mf = _cq(store).last_file
    assert mf is not None
    before = mf.reserved_upto
    store.flush_indexes(thorough=False)
    assert mf.reserved_upto == before


def test_the_flush_thread_keeps_a_busy_queue_reserved_ahead(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(
        flush_interval_consume_queue_ms=20, reserve_indexes_ahead_s=1.0, consume_queue_units_per_file=50_000
    )
    _append(store, 100)
    mf = _cq(store).last_file
    assert mf is not None
    sent = [100]

    def reserved_far_ahead() -> bool:
        _append(store, 40, start=sent[0])  # busy all along: every round finds it dirty
        sent[0] += 40
        # The write path's own chunks (as much as the queue holds) keep at most about twice its
        # position reserved; a round reserves 50 rounds' worth (1 s of 20 ms rounds).
        return mf.reserved_upto > 3 * mf.wrote_position + 4096

    assert until(reserved_far_ahead)
    assert _cq(store).last_file is mf


def test_the_index_file_gets_a_rounds_worth_of_its_entries_reserved(tmp_path: Path) -> None:
    f = IndexFile(str(tmp_path / "00000000000000000000"), 64, 200_000)
    try:
        per_round = ENTRY_RESERVE_BYTES // INDEX_ENTRY_SIZE + 1_000  # more than the first chunk holds
        for i in range(per_round):
            assert f.put_key(f"T#k{i}", i * 100, 1_000 + i)
        assert f.reserve_ahead(2.0)
        at = f.mf.file_size - 200_000 * INDEX_ENTRY_SIZE + f.index_count * INDEX_ENTRY_SIZE
        assert f.mf.reserved_upto >= at + 2 * per_round * INDEX_ENTRY_SIZE
        reserved = f.mf.reserved_upto
        for i in range(per_round, 2 * per_round):
            assert f.put_key(f"T#k{i}", i * 100, 1_000 + i)
        assert f.mf.reserved_upto == reserved  # the entries found their blocks reserved
        for i in (0, per_round, 2 * per_round - 1):
            found: list[int] = []
            f.query(f"T#k{i}", 0, 10**12, 5, found)
            assert found == [i * 100]
        assert f.reserve_ahead(2.0)  # as busy again: two rounds' worth after the newest entry
        assert not f.reserve_ahead(2.0)  # nothing added since the last call: nothing to do
    finally:
        f.close()
