"""MessageStore, the facade: pull reads with RocketMQ's statuses, queue offsets, batches, message
ids, lookups by offset, key and time, and transactional records (message_store.py)."""

from __future__ import annotations

import itertools
import mmap
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.broker.pull import records_in
from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, StoreConfig
from data_plane.store.message import (
    BLANK_MAGIC_CODE,
    MAGIC_AND_SIZE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    StoredMessage,
    decode_message_id,
    decode_record,
    tags_hash_code,
)
from data_plane.store.status import AppendResult, GetMessageResult
from tests.conftest import ManualClock, small_config
from tests.page_cache import mapped_resident_kib

FILE_SIZE = 64 * 1024  # small_config's CommitLog file size


def _put(store: MessageStore, msg: Message) -> AppendResult:
    result = store.put_messages_blocking([msg])
    assert result.status is PutMessageStatus.PUT_OK, result
    assert result.append is not None
    return result.append


def _record_size(msg: Message) -> int:
    props = "".join(f"{k}\x01{v}\x02" for k, v in msg.properties.items()).encode()
    return 88 + len(msg.body) + 1 + len(msg.topic.encode()) + 2 + len(props)


def _pull_all(store: MessageStore, topic: str, queue_id: int) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    offset = store.min_offset_in_queue(topic, queue_id)
    while True:
        r = store.get_message(topic, queue_id, offset, 32)
        if r.status is not GetMessageStatus.FOUND:
            return out
        out.extend(decode_record(m) for m in r.messages)
        offset = r.next_begin_offset


def _release(result: GetMessageResult) -> None:
    """Let go of the mapping slices a read handed out (so files can be unmapped at once)."""
    for m in result.messages:
        m.release()
    result.messages.clear()


@pytest.fixture
def store_with_ratio(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., MessageStore]]:
    """A started store whose disk-usage reading is fixed at 10 % (retention by age only)."""
    made: list[MessageStore] = []

    def make(**changes: object) -> MessageStore:
        config: StoreConfig = small_config(str(tmp_path / "store"), **changes)
        store = MessageStore(config, clock_ms=clock, disk_usage_ratio=lambda _path: 0.10)
        store.start()
        made.append(store)
        return store

    yield make
    for store in made:
        store.shutdown()


def _store_with_deleted_head(make: Callable[..., MessageStore]) -> tuple[MessageStore, list[AppendResult]]:
    """A store with 200 messages in queue T/0 whose first CommitLog files were deleted."""
    store = make()
    results = [_put(store, Message("T", b"%04d" % i + b"r" * 900)) for i in range(200)]
    assert len(store.commit_log.mfq.files) >= 3
    store.commit_log.mfq.flush_all()
    report = store.clean_once(now_s=time.time() + 100 * 3600)  # 72 h retention: all but the last expire
    assert report.commit_log_files_deleted >= 2
    assert store.min_phy_offset() > 0
    return store, results


# --- get_message statuses ---------------------------------------------------------------------


def test_get_message_from_an_unknown_queue_answers_no_matched_logic_queue(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    _put(store, Message("T", b"hello", queue_id=0))
    for topic, queue_id in (("T", 1), ("Other", 0)):
        r = store.get_message(topic, queue_id, 0, 32)
        assert r.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        assert r.next_begin_offset == 0
        assert r.messages == []


def test_get_message_from_a_known_but_empty_queue_answers_no_message_in_queue(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    path = tmp_path / "store"
    os.makedirs(path / "consumequeue" / "T" / "0")  # the queue exists on disk, with no unit
    store = make_store(str(path))
    for offset in (0, 5):
        r = store.get_message("T", 0, offset, 32)
        assert r.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
        assert r.next_begin_offset == 0
        assert (r.min_offset, r.max_offset) == (0, 0)
        assert r.messages == []


def test_get_message_below_the_min_offset_answers_offset_too_small_with_the_min_as_next(
    store_with_ratio: Callable[..., MessageStore],
) -> None:
    store, results = _store_with_deleted_head(store_with_ratio)
    new_min = store.min_offset_in_queue("T", 0)
    # The first queue offset whose record is still in the log.
    expected_min = next(i for i, a in enumerate(results) if a.wrote_offset >= store.min_phy_offset())
    assert new_min == expected_min
    for offset in (0, new_min - 1):
        r = store.get_message("T", 0, offset, 32)
        assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert r.next_begin_offset == new_min
        assert r.messages == []
    r = store.get_message("T", 0, new_min, 1)
    assert r.status is GetMessageStatus.FOUND
    assert decode_record(r.messages[0]).body.startswith(b"%04d" % new_min)
    _release(r)


def test_get_message_at_the_max_offset_answers_offset_overflow_one_with_the_same_offset(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    for i in range(5):
        _put(store, Message("T", b"m%d" % i))
    r = store.get_message("T", 0, 5, 32)
    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    assert r.next_begin_offset == 5
    assert (r.min_offset, r.max_offset) == (0, 5)
    assert r.messages == []


def test_get_message_beyond_the_max_offset_answers_overflow_badly_with_min_when_min_is_zero(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    for i in range(5):
        _put(store, Message("T", b"m%d" % i))
    for offset in (6, 1000):
        r = store.get_message("T", 0, offset, 32)
        assert r.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert r.next_begin_offset == 0
        assert r.messages == []


def test_get_message_beyond_the_max_offset_answers_overflow_badly_with_max_when_min_is_not_zero(
    store_with_ratio: Callable[..., MessageStore],
) -> None:
    store, _ = _store_with_deleted_head(store_with_ratio)
    assert store.min_offset_in_queue("T", 0) > 0
    r = store.get_message("T", 0, 201, 32)
    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
    assert r.next_begin_offset == 200
    assert r.max_offset == 200


def test_get_message_found_returns_the_messages_in_queue_order_with_the_next_begin_offset(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    bodies = [b"body-%03d" % i * (i + 1) for i in range(10)]
    for body in bodies:
        _put(store, Message("T", body, queue_id=2))
    r = store.get_message("T", 2, 3, 4)
    assert r.status is GetMessageStatus.FOUND
    assert r.next_begin_offset == 7
    assert r.queue_offsets == [3, 4, 5, 6]
    assert [decode_record(m).body for m in r.messages] == bodies[3:7]
    assert r.buffer_total_size == sum(len(m) for m in r.messages)
    assert (r.min_offset, r.max_offset) == (0, 10)
    _release(r)


def test_a_tag_filter_matching_nothing_answers_no_matched_message_and_moves_past_the_scanned_units(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    for i in range(10):
        _put(store, Message("T", b"m%d" % i, properties={"TAGS": "a" if i % 2 else "b"}))
    r = store.get_message("T", 0, 0, 32, tags_codes={tags_hash_code("x")})
    assert r.status is GetMessageStatus.NO_MATCHED_MESSAGE
    assert r.messages == []
    assert r.next_begin_offset == 10  # every unit was scanned: the consumer moves on


def test_a_tag_filter_returns_only_the_messages_with_a_matching_tag(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    for i in range(20):
        _put(store, Message("T", b"m%d" % i, properties={"TAGS": "a" if i % 2 == 0 else "b"}))
    r = store.get_message("T", 0, 0, 32, tags_codes={tags_hash_code("a")})
    assert r.status is GetMessageStatus.FOUND
    assert r.queue_offsets == list(range(0, 20, 2))
    assert [decode_record(m).body for m in r.messages] == [b"m%d" % i for i in range(0, 20, 2)]
    assert {decode_record(m).tags for m in r.messages} == {"a"}
    assert r.next_begin_offset == 20
    _release(r)
    # Stopping at max_msg_nums: the next read resumes right after the last unit looked at.
    r = store.get_message("T", 0, 0, 3, tags_codes={tags_hash_code("a")})
    assert r.queue_offsets == [0, 2, 4]
    assert r.next_begin_offset == 5
    _release(r)


def test_get_message_returns_at_most_max_msg_nums_messages(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    for i in range(10):
        _put(store, Message("T", b"m%d" % i))
    for wanted in (1, 3, 10):
        r = store.get_message("T", 0, 0, wanted)
        assert r.status is GetMessageStatus.FOUND
        assert r.message_count == wanted
        assert r.next_begin_offset == wanted
        _release(r)


def test_a_coalesced_read_answers_runs_of_adjacent_records_with_one_offset_per_message(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    batch = [Message("T", b"batch-%d" % i, queue_id=0) for i in range(5)]
    assert store.put_messages_blocking(batch).status is PutMessageStatus.PUT_OK  # stored back to back
    _put(store, Message("T", b"other queue", queue_id=1))
    for i in range(3):
        _put(store, Message("T", b"single-%d" % i, queue_id=0))
    plain = store.get_message("T", 0, 0, 32)
    r = store.get_message("T", 0, 0, 32, coalesce=True)
    assert r.status is GetMessageStatus.FOUND
    assert plain.message_count == r.message_count == 8
    assert r.queue_offsets == plain.queue_offsets == list(range(8))
    assert r.next_begin_offset == plain.next_begin_offset == 8
    assert r.buffer_total_size == plain.buffer_total_size
    # Two runs: the batch, then the three singles (the other queue's record lies between).
    assert [len(m) for m in r.messages] == [
        sum(len(m) for m in plain.messages[:5]),
        sum(len(m) for m in plain.messages[5:]),
    ]
    assert b"".join(r.messages) == b"".join(plain.messages)
    assert records_in(r.messages) == records_in(plain.messages) == 8  # what a traced pull reports
    # The message limit counts messages, not slices.
    three = store.get_message("T", 0, 1, 3, coalesce=True)
    assert (three.message_count, three.next_begin_offset, len(three.messages)) == (3, 4, 1)
    assert bytes(three.messages[0]) == b"".join(plain.messages[1:4])
    for res in (plain, r, three):
        _release(res)


def test_a_unit_pointing_past_what_the_log_holds_is_skipped_not_looped_on(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    _put(store, Message("T", b"first", queue_id=0))
    cq = store.queues.get("T", 0)
    assert cq is not None
    end = store.max_phy_offset()
    # A unit (forged here) for a record beyond the log's write position, in the same file.
    assert cq.put(end + 100, 90, 0, 1)
    for coalesce in (False, True):
        r = store.get_message("T", 0, 1, 32, coalesce=coalesce)  # answers, instead of spinning
        assert r.status is GetMessageStatus.OFFSET_FOUND_NULL
        assert (r.messages, r.next_begin_offset) == ([], 2)
        both = store.get_message("T", 0, 0, 32, coalesce=coalesce)
        assert both.status is GetMessageStatus.FOUND
        assert both.queue_offsets == [0]
        assert [decode_record(m).body for m in both.messages] == [b"first"]
        _release(both)


def test_get_message_stops_before_exceeding_max_transfer_bytes_but_always_returns_one_message(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    msg = Message("T", b"x" * 400)
    size = _record_size(msg)
    store = make_store(max_transfer_bytes_on_message=3 * size + size // 2)
    for _ in range(10):
        _put(store, msg)
    r = store.get_message("T", 0, 0, 32)
    assert r.status is GetMessageStatus.FOUND
    assert r.message_count == 3
    assert r.buffer_total_size == 3 * size
    assert r.next_begin_offset == 3
    _release(r)
    store.shutdown()

    small = make_store(str(Path(store.config.store_path).parent / "small"), max_transfer_bytes_on_message=size // 2)
    for _ in range(3):
        _put(small, msg)
    r = small.get_message("T", 0, 0, 32)
    assert r.status is GetMessageStatus.FOUND
    assert r.message_count == 1  # a message larger than the limit still gets through, alone
    assert r.next_begin_offset == 1
    _release(r)


def test_returned_messages_are_slices_of_the_commit_log_mapping_not_copies(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    msg = Message("T", b"zero-copy body", properties={"KEYS": "k1", "TAGS": "t"}, born_timestamp=42)
    appended = _put(store, msg)
    r = store.get_message("T", 0, 0, 1)
    assert r.status is GetMessageStatus.FOUND
    view = r.messages[0]
    assert isinstance(view, memoryview)
    assert isinstance(view.obj, mmap.mmap)
    mf = store.commit_log.mfq.find_by_offset(appended.wrote_offset)
    assert mf is not None
    assert view.obj is mf.mv.obj
    # Same bytes as the file on disk at that offset.
    with open(mf.path, "rb") as f:
        f.seek(appended.wrote_offset - mf.file_from_offset)
        assert f.read(len(view)) == bytes(view)
    decoded = decode_record(view)
    assert (decoded.topic, decoded.body, decoded.properties) == (msg.topic, msg.body, msg.properties)
    assert (decoded.born_timestamp, decoded.commit_log_offset) == (42, appended.wrote_offset)
    _release(r)


# --- queue offsets and batches ----------------------------------------------------------------


def test_queue_offsets_are_assigned_per_topic_and_queue_from_zero_and_continue_after_a_restart(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    queues = [("T", 0), ("T", 1), ("U", 0), ("T", 0), ("U", 0), ("T", 0), ("T", 1)]
    expected: dict[tuple[str, int], int] = {}
    for round_ in range(2):
        for topic, queue_id in queues:
            appended = _put(store, Message(topic, b"%s-%d-%d" % (topic.encode(), queue_id, round_), queue_id))
            want = expected.get((topic, queue_id), 0)
            assert appended.queue_offset == want
            stored = store.look_message_by_offset(appended.wrote_offset)
            assert stored is not None
            assert stored.queue_offset == want
            expected[(topic, queue_id)] = want + 1
        if round_ == 0:
            store.shutdown()
            store.start()
            for (topic, queue_id), n in expected.items():
                assert store.max_offset_in_queue(topic, queue_id) == n
    for (topic, queue_id), n in expected.items():
        pulled = _pull_all(store, topic, queue_id)
        assert [m.queue_offset for m in pulled] == list(range(n))
        assert all((m.topic, m.queue_id) == (topic, queue_id) for m in pulled)


def test_a_batch_of_32_lands_contiguously_with_consecutive_queue_offsets(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    for i in range(5):
        _put(store, Message("T", b"single %d" % i, queue_id=1))
    batch = [
        Message("T", b"batch %02d " % i * (i % 4 + 1), queue_id=1, properties={"KEYS": f"b{i}"}) for i in range(32)
    ]
    result = store.put_messages_blocking(batch)
    assert result.status is PutMessageStatus.PUT_OK
    appended = result.append
    assert appended is not None
    assert appended.msg_num == 32
    assert appended.queue_offset == 5
    assert appended.wrote_bytes == sum(_record_size(m) for m in batch)
    assert store.max_offset_in_queue("T", 1) == 37
    r = store.get_message("T", 1, 5, 32)
    assert r.status is GetMessageStatus.FOUND
    assert r.queue_offsets == list(range(5, 37))
    stored = [decode_record(m) for m in r.messages]
    assert [m.body for m in stored] == [m.body for m in batch]
    assert [m.queue_offset for m in stored] == list(range(5, 37))
    assert stored[0].commit_log_offset == appended.wrote_offset
    for before, after in itertools.pairwise(stored):
        assert before.commit_log_offset + before.total_size == after.commit_log_offset
    assert stored[-1].commit_log_offset + stored[-1].total_size == appended.wrote_offset + appended.wrote_bytes
    # The batch's answer names every record (taken from the bytes the append laid out).
    ids = appended.msg_ids.split(",")
    assert ids == [store.commit_log.msg_id(m.commit_log_offset) for m in stored]
    assert ids[0] == appended.msg_id
    assert [store.view_message_by_id(i).body for i in ids] == [m.body for m in batch]  # type: ignore[union-attr]
    _release(r)
    single = _put(store, Message("T", b"one more", queue_id=1))
    assert single.msg_ids == single.msg_id


@pytest.mark.parametrize(
    "batch",
    [
        [Message("T", b"a", 0), Message("U", b"b", 0)],
        [Message("T", b"a", 0), Message("T", b"b", 1)],
        [Message("T", b"a", 0), Message("T", b"b", 0), Message("T", b"c", 3)],
    ],
    ids=["two topics", "two queues", "last one in another queue"],
)
def test_a_batch_mixing_topics_or_queues_is_refused_and_writes_nothing(
    make_store: Callable[..., MessageStore], write_path: str, batch: list[Message]
) -> None:
    store = make_store()
    _put(store, Message("T", b"before"))
    max_phy = store.max_phy_offset()
    result = store.put_messages_blocking(batch)
    assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert result.reason
    assert store.max_phy_offset() == max_phy
    assert store.max_offset_in_queue("T", 0) == 1
    for topic, queue_id in (("U", 0), ("T", 1), ("T", 3)):
        assert store.max_offset_in_queue(topic, queue_id) == 0
    assert _put(store, Message("T", b"after")).queue_offset == 1


def test_crossing_a_commit_log_file_leaves_a_blank_record_and_reads_still_work(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    bodies = [b"%05d" % i + b"y" * 995 for i in range(150)]
    results = [_put(store, Message("T", body, queue_id=i % 2)) for i, body in enumerate(bodies)]
    assert len(store.commit_log.mfq.files) >= 2
    # The last record of the first file, and the first record of the second one.
    in_first = [a for a in results if a.wrote_offset < FILE_SIZE]
    end_of_first = in_first[-1].wrote_offset + in_first[-1].wrote_bytes
    assert results[len(in_first)].wrote_offset == FILE_SIZE
    assert FILE_SIZE - end_of_first < _record_size(Message("T", bodies[0])) + 8
    with open(os.path.join(store.config.commit_log_path, f"{0:020d}"), "rb") as f:
        f.seek(end_of_first)
        blank = f.read(8)
    assert MAGIC_AND_SIZE.unpack(blank) == (FILE_SIZE - end_of_first, BLANK_MAGIC_CODE)
    assert store.look_message_by_offset(end_of_first) is None
    pulled = _pull_all(store, "T", 0) + _pull_all(store, "T", 1)
    assert sorted(m.body for m in pulled) == sorted(bodies)


def test_message_ids_are_32_hex_digits_that_lead_back_to_the_record(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    msgs = [Message("T", b"id body %d" % i, queue_id=i % 3, properties={"KEYS": f"k{i}"}) for i in range(20)]
    for msg in msgs:
        appended = _put(store, msg)
        msg_id = appended.msg_id
        assert len(msg_id) == 32
        assert all(c in "0123456789ABCDEF" for c in msg_id)
        assert decode_message_id(msg_id) == ("127.0.0.1", 10911, appended.wrote_offset)
        viewed = store.view_message_by_id(msg_id)
        assert viewed is not None
        assert (viewed.topic, viewed.queue_id, viewed.body, viewed.properties) == (
            msg.topic,
            msg.queue_id,
            msg.body,
            msg.properties,
        )
        assert viewed.msg_id == msg_id
    with pytest.raises(ValueError, match="32 hex digits"):
        store.view_message_by_id("ABC")
    beyond = store.commit_log.msg_id(store.max_phy_offset())
    assert store.view_message_by_id(beyond) is None


def test_look_message_by_offset_decodes_the_record_at_a_record_offset_only(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    first = _put(store, Message("T", b"first", properties={"TAGS": "t1"}))
    second = _put(store, Message("T", b"second", queue_id=4, flag=9))
    got = store.look_message_by_offset(second.wrote_offset)
    assert got is not None
    assert (got.body, got.queue_id, got.flag, got.commit_log_offset) == (b"second", 4, 9, second.wrote_offset)
    got = store.look_message_by_offset(first.wrote_offset)
    assert got is not None
    assert (got.body, got.tags) == (b"first", "t1")
    assert store.look_message_by_offset(first.wrote_offset + 1) is None  # not where a record starts
    assert store.look_message_by_offset(store.max_phy_offset()) is None


# --- query by key -----------------------------------------------------------------------------


def test_query_message_finds_by_keys_and_by_uniq_key_newest_first(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    offsets = []
    for i in range(6):
        props = {"KEYS": f"order-{i} common", "UNIQ_KEY": f"U{i:04d}"}
        offsets.append(_put(store, Message("T", b"q%d" % i, queue_id=i % 2, properties=props)).wrote_offset)
    found = store.query_message("T", "common")
    assert [m.body for m in found] == [b"q%d" % i for i in reversed(range(6))]
    assert [m.commit_log_offset for m in found] == list(reversed(offsets))
    assert [m.body for m in store.query_message("T", "order-3")] == [b"q3"]
    assert [m.body for m in store.query_message("T", "U0004")] == [b"q4"]
    assert store.query_message("T", "order-99") == []


def test_query_message_returns_at_most_max_num_newest_messages(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    for i in range(10):
        _put(store, Message("T", b"q%d" % i, properties={"KEYS": "same"}))
    assert [m.body for m in store.query_message("T", "same", max_num=3)] == [b"q9", b"q8", b"q7"]
    assert len(store.query_message("T", "same", max_num=1)) == 1
    assert len(store.query_message("T", "same", max_num=100)) == 10


def test_query_message_respects_the_begin_and_end_time(
    make_store: Callable[..., MessageStore], clock: ManualClock, write_path: str
) -> None:
    store = make_store()
    t0 = clock.now_ms
    for i in range(4):
        _put(store, Message("T", b"t%d" % i, properties={"KEYS": "timed"}))
        clock.advance(10_000)
    # Stored at t0, t0+10s, t0+20s, t0+30s.
    assert [m.body for m in store.query_message("T", "timed", begin_ms=t0 + 5_000, end_ms=t0 + 25_000)] == [
        b"t2",
        b"t1",
    ]
    assert [m.body for m in store.query_message("T", "timed", begin_ms=t0 + 25_000)] == [b"t3"]
    assert [m.body for m in store.query_message("T", "timed", end_ms=t0 + 5_000)] == [b"t0"]
    assert store.query_message("T", "timed", begin_ms=t0 + 40_000) == []
    assert all(
        t0 + 5_000 <= m.store_timestamp <= t0 + 25_000
        for m in store.query_message("T", "timed", begin_ms=t0 + 5_000, end_ms=t0 + 25_000)
    )


def test_query_message_does_not_return_a_message_of_another_topic_with_the_same_key(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    _put(store, Message("T", b"mine", properties={"KEYS": "shared", "UNIQ_KEY": "SAMEUNIQ"}))
    _put(store, Message("U", b"theirs", properties={"KEYS": "shared", "UNIQ_KEY": "SAMEUNIQ"}))
    _put(store, Message("U", b"only theirs", properties={"KEYS": "u-only"}))
    assert [m.body for m in store.query_message("T", "shared")] == [b"mine"]
    assert [m.body for m in store.query_message("T", "SAMEUNIQ")] == [b"mine"]
    assert [m.body for m in store.query_message("U", "shared")] == [b"theirs"]
    assert store.query_message("T", "u-only") == []


# --- offset by time ---------------------------------------------------------------------------


def test_offset_in_queue_by_time_is_the_first_offset_stored_at_or_after_the_time(
    make_store: Callable[..., MessageStore], clock: ManualClock, write_path: str
) -> None:
    store = make_store()
    t0 = clock.now_ms
    for i in range(8):
        _put(store, Message("T", b"at %d" % i, queue_id=1))
        _put(store, Message("Other", b"noise %d" % i))  # other queues do not disturb the search
        clock.advance(1_000)
    # Message i of T/1 was stored at t0 + i s.
    assert store.offset_in_queue_by_time("T", 1, t0 - 50_000) == 0
    assert store.offset_in_queue_by_time("T", 1, t0) == 0
    assert store.offset_in_queue_by_time("T", 1, t0 + 1) == 1
    assert store.offset_in_queue_by_time("T", 1, t0 + 3_000) == 3
    assert store.offset_in_queue_by_time("T", 1, t0 + 3_500) == 4
    assert store.offset_in_queue_by_time("T", 1, t0 + 7_000) == 7
    assert store.offset_in_queue_by_time("T", 1, t0 + 3_600_000) == 8  # the future: the max offset
    for offset in range(8):
        assert store.message_store_timestamp("T", 1, offset) == t0 + offset * 1_000


# --- transactional records --------------------------------------------------------------------


def test_prepared_and_rolled_back_records_take_no_queue_slot_while_committed_ones_do(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    normal = _put(store, Message("T", b"normal-1"))
    assert store.max_offset_in_queue("T", 0) == 1
    prepared = _put(store, Message("T", b"prepared", sys_flag=TRANSACTION_PREPARED_TYPE))
    assert store.max_offset_in_queue("T", 0) == 1
    rolled_back = _put(store, Message("T", b"rolled back", sys_flag=TRANSACTION_ROLLBACK_TYPE))
    assert store.max_offset_in_queue("T", 0) == 1
    committed = _put(store, Message("T", b"committed", sys_flag=TRANSACTION_COMMIT_TYPE))
    assert store.max_offset_in_queue("T", 0) == 2
    assert committed.queue_offset == 1
    last = _put(store, Message("T", b"normal-2"))
    assert last.queue_offset == 2
    assert store.max_offset_in_queue("T", 0) == 3
    assert normal.queue_offset == 0
    pulled = _pull_all(store, "T", 0)
    assert [(m.body, m.sys_flag) for m in pulled] == [
        (b"normal-1", 0),
        (b"committed", TRANSACTION_COMMIT_TYPE),
        (b"normal-2", 0),
    ]
    # Both transactional records are in the log, readable by their physical offset.
    for appended, body, flag in (
        (prepared, b"prepared", TRANSACTION_PREPARED_TYPE),
        (rolled_back, b"rolled back", TRANSACTION_ROLLBACK_TYPE),
    ):
        got = store.look_message_by_offset(appended.wrote_offset)
        assert got is not None
        assert (got.body, got.sys_flag) == (body, flag)


def test_a_batch_led_by_a_prepared_transaction_indexes_the_rest_at_the_queue_s_next_offsets(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    # Two units a ConsumeQueue file: the batch's units spill into a new file, so they are not
    # written straight into the current one but placed by their queue offsets.
    store = make_store(consume_queue_units_per_file=2)
    first, _ = store.append([Message(topic="T", body=b"before", queue_id=0)])
    assert first.ok
    batch = [Message(topic="T", body=b"half", queue_id=0, sys_flag=0x4)] + [
        Message(topic="T", body=f"m{i}".encode(), queue_id=0) for i in range(3)
    ]
    result, _ = store.append(batch)
    assert result.ok
    assert store.max_offset_in_queue("T", 0) == 4  # the prepared record takes no unit
    records = _pull_all(store, "T", 0)
    assert [r.body for r in records] == [b"before", b"m0", b"m1", b"m2"]
    assert [r.queue_offset for r in records] == [0, 1, 2, 3]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_index_entry_pages_behind_the_newest_leave_the_page_tables_between_index_flushes(
    make_store: Callable[..., MessageStore],
) -> None:
    slots, entries = 1024, 400_000  # an IndexFile of 8 MiB of entries after a 4 KiB slot table
    store = make_store(
        index_hash_slots=slots,
        index_max_entries=entries,
        flush_interval_consume_queue_ms=3_600_000,  # only the rounds this test runs
        flush_interval_index_ms=3_600_000,  # and the index itself flushed at most once
        commit_log_file_size_bytes=64 * 1024 * 1024,
    )
    assert store.index is not None

    def put_keyed(n: int, start: int) -> None:
        for i in range(start, start + n, 32):
            msgs = [Message("T", b"k", properties={"KEYS": f"key-{j}"}) for j in range(i, i + 32)]
            assert store.put_messages_blocking(msgs).status is PutMessageStatus.PUT_OK

    put_keyed(64_000, 0)
    store.flush_indexes(False)  # may flush the index (the first round); releases entries either way
    put_keyed(128_000, 64_000)  # ~2.4 MiB more entries, written through the mapping
    path = store.index.files[-1].path
    slot_table_kib = (40 + slots * 4) // 1024 + 1
    keep_kib = 1024  # release_entries keeps the newest MiB
    assert mapped_resident_kib(path) > slot_table_kib + keep_kib + 1024
    store.flush_indexes(False)  # a round with no index flush (an hour not yet passed)
    assert mapped_resident_kib(path) <= slot_table_kib + keep_kib + 1024 + 8
    # Nothing is lost: the released entries still answer queries (the page cache keeps them).
    assert [m.body for m in store.query_message("T", "key-5")] == [b"k"]
    assert [m.body for m in store.query_message("T", "key-150000")] == [b"k"]
