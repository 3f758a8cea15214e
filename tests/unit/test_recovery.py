"""Recovery: after a clean stop or a crash the log and every index agree, and nothing torn or
corrupt is served (recovery.py, commit_log.py scan, consume_queue.py, index_file.py).

A crash is what a copy of a running store's directory is: the files as they are on disk at
that moment, the abort file included, nothing flushed or closed for the occasion."""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.checkpoint import StoreCheckpoint
from data_plane.store.message import MESSAGE_MAGIC_CODE, decode_record

FILE_SIZE = 64 * 1024  # small_config's CommitLog file size
QUEUES = [("T", 0), ("T", 1), ("T", 2), ("U", 0)]

# What a queue holds: (min offset, max offset, [(queue offset, log offset, record bytes)]).
QueueState = tuple[int, int, list[tuple[int, int, bytes]]]


@dataclass
class Put:
    topic: str
    queue_id: int
    queue_offset: int
    offset: int
    size: int
    key: str
    uniq_key: str
    record: bytes

    @property
    def end(self) -> int:
        return self.offset + self.size


def _put_many(store: MessageStore, n: int, rng: random.Random, *, tag: str = "m", min_files: int = 1) -> list[Put]:
    """At least ``n`` random messages over QUEUES, and more until the log spans ``min_files``."""
    puts: list[Put] = []
    i = -1
    while len(puts) < n or len(store.commit_log.mfq.files) < min_files:
        i += 1
        topic, queue_id = rng.choice(QUEUES)
        key = f"{tag}-{i}"
        uniq = f"UNIQ{tag.upper()}{i:06d}"
        body = f"{tag} {i} ".encode() * rng.randint(1, 120)
        props = {"KEYS": key, "TAGS": rng.choice(["a", "b"]), "UNIQ_KEY": uniq}
        result = store.put_messages_blocking([Message(topic, body, queue_id, properties=props)])
        assert result.status is PutMessageStatus.PUT_OK, result
        a = result.append
        assert a is not None
        raw = store.read_record(a.wrote_offset)
        assert raw is not None
        puts.append(Put(topic, queue_id, a.queue_offset, a.wrote_offset, a.wrote_bytes, key, uniq, bytes(raw)))
    return puts


def _queue_state(store: MessageStore, topic: str, queue_id: int) -> QueueState:
    lo = store.min_offset_in_queue(topic, queue_id)
    hi = store.max_offset_in_queue(topic, queue_id)
    units: list[tuple[int, int, bytes]] = []
    offset = lo
    while offset < hi:
        r = store.get_message(topic, queue_id, offset, 32)
        assert r.status is GetMessageStatus.FOUND, (topic, queue_id, offset, r.status)
        for qo, m in zip(r.queue_offsets, r.messages, strict=True):
            units.append((qo, store.commit_log_offset_in_queue(topic, queue_id, qo), bytes(m)))
            m.release()
        offset = r.next_begin_offset
    return lo, hi, units


def _snapshot(store: MessageStore) -> dict[object, object]:
    snap: dict[object, object] = {
        "log": (store.min_phy_offset(), store.max_phy_offset()),
        "queues": sorted((cq.topic, cq.queue_id) for cq in store.queues if cq.max_offset_in_queue() > 0),
    }
    for topic, queue_id in QUEUES:
        snap[(topic, queue_id)] = _queue_state(store, topic, queue_id)
    return snap


def _assert_all_there(store: MessageStore, puts: list[Put]) -> None:
    for p in puts:
        r = store.get_message(p.topic, p.queue_id, p.queue_offset, 1)
        assert r.status is GetMessageStatus.FOUND, (p, r.status)
        assert bytes(r.messages[0]) == p.record
        r.messages[0].release()
    for p in puts[:: max(1, len(puts) // 20)]:
        assert [m.commit_log_offset for m in store.query_message(p.topic, p.key)] == [p.offset]


def _assert_puts_continue(store: MessageStore, puts: list[Put]) -> None:
    """New messages get the next queue offset of each queue and are readable."""
    for topic, queue_id in QUEUES:
        expected = sum(1 for p in puts if (p.topic, p.queue_id) == (topic, queue_id))
        assert store.max_offset_in_queue(topic, queue_id) == expected
        result = store.put_messages_blocking([Message(topic, b"after recovery", queue_id, properties={"KEYS": "new"})])
        assert result.status is PutMessageStatus.PUT_OK
        assert result.append is not None
        assert result.append.queue_offset == expected
        r = store.get_message(topic, queue_id, expected, 1)
        assert r.status is GetMessageStatus.FOUND
        assert decode_record(r.messages[0]).body == b"after recovery"
        r.messages[0].release()


def _wait_for_checkpoint(store: MessageStore) -> None:
    """Until the checkpoint records everything (an idle store just before its crash)."""
    target = store.max_phy_offset()
    deadline = time.monotonic() + 5
    while StoreCheckpoint.load(store.config.checkpoint_path).min_offset() != target:
        assert time.monotonic() < deadline, "the checkpoint never caught up with the log"
        time.sleep(0.01)


def _crash_copy(store: MessageStore, dest: Path) -> str:
    """What a crash of the running ``store`` leaves on disk, as a directory at ``dest``."""
    store.commit_log.mfq.flush_all()
    _wait_for_checkpoint(store)
    shutil.copytree(store.config.store_path, dest)
    assert (dest / "abort").exists(), "a running store keeps its abort file"
    return str(dest)


def _clean_copy(store: MessageStore, dest: Path) -> str:
    store.shutdown()
    shutil.copytree(store.config.store_path, dest)
    assert not (dest / "abort").exists()
    return str(dest)


def _log_file(store_path: str, offset: int) -> str:
    name = f"{offset - offset % FILE_SIZE:020d}"
    return os.path.join(store_path, "commitlog", name)


def _patch(path: str, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _last_file_start(store_path: str) -> int:
    return max(int(n) for n in os.listdir(os.path.join(store_path, "commitlog")) if n.isdigit())


# --- clean stop and crash ---------------------------------------------------------------------


def test_a_clean_shutdown_and_start_give_back_identical_offsets_and_messages(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int, write_path: str
) -> None:
    store = make_store()
    puts = _put_many(store, 300, random.Random(seed), min_files=3)
    before = _snapshot(store)
    store.shutdown()
    store.start()
    assert not store.recovered_abnormally
    assert _snapshot(store) == before
    _assert_all_there(store, puts)
    store.shutdown()
    again = make_store(store.config.store_path)  # a new process on the same directory
    assert _snapshot(again) == before
    _assert_puts_continue(again, puts)


def test_a_crash_keeps_every_message_put_before_it(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int
) -> None:
    store = make_store()
    puts = _put_many(store, 300, random.Random(seed))
    before = _snapshot(store)
    recovered = make_store(_crash_copy(store, tmp_path / "crashed"))
    assert recovered.recovered_abnormally
    assert _snapshot(recovered) == before
    _assert_all_there(recovered, puts)
    _assert_puts_continue(recovered, puts)


def test_index_files_keep_their_own_flush_cadence_and_a_crash_rebuilds_the_entries_after_it(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int
) -> None:
    """IndexFiles are flushed every ``flush_interval_index_ms`` (their random slot writes fault
    after each flush): the checkpoint's index offset stays at that flush while the log and the
    ConsumeQueues move on, and recovery from a crash rebuilds the newer entries from the log —
    every key found once, at its message."""
    store = make_store(flush_interval_index_ms=3_600_000)
    indexed_at_start = StoreCheckpoint.load(store.config.checkpoint_path).index_offset
    puts = _put_many(store, 100, random.Random(seed))
    target = store.max_phy_offset()
    before = _snapshot(store)
    store.commit_log.mfq.flush_all()

    def log_and_queues_checkpointed() -> bool:
        cp = StoreCheckpoint.load(store.config.checkpoint_path)
        return cp.valid and cp.physic_offset == target and cp.logics_offset == target

    deadline = time.monotonic() + 5
    while not log_and_queues_checkpointed():
        assert time.monotonic() < deadline, "the checkpoint never caught up with the log"
        time.sleep(0.01)
    cp = StoreCheckpoint.load(store.config.checkpoint_path)
    assert cp.index_offset == indexed_at_start < target
    assert cp.min_offset() == indexed_at_start
    dest = tmp_path / "crashed"
    shutil.copytree(store.config.store_path, dest)
    recovered = make_store(str(dest))
    assert recovered.recovered_abnormally
    assert _snapshot(recovered) == before
    _assert_all_there(recovered, puts)
    assert StoreCheckpoint.load(recovered.config.checkpoint_path).index_offset == target  # flushed after recovery
    store.shutdown()  # a clean stop flushes the index whatever its cadence
    assert StoreCheckpoint.load(store.config.checkpoint_path).index_offset == target


# --- torn and corrupt tails -------------------------------------------------------------------


def _garbage(kind: str, last: Put) -> bytes:
    if kind == "junk bytes":
        return b"\xde\xad\xbe\xef\x17" * 97
    if kind == "a record header and nothing else":
        return (300).to_bytes(4, "big") + MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)
    # The first part of a record written at the tail, the rest never made it to disk.
    return last.record[: len(last.record) * 2 // 3]


@pytest.mark.parametrize("kind", ["junk bytes", "a record header and nothing else", "two thirds of a record"])
def test_a_torn_tail_is_cut_back_to_the_last_sound_record_and_puts_continue(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int, kind: str
) -> None:
    store = make_store()
    puts = _put_many(store, 120, random.Random(seed))
    end = store.max_phy_offset()
    before = _snapshot(store)
    copy = _crash_copy(store, tmp_path / "crashed")
    _patch(_log_file(copy, end), end % FILE_SIZE, _garbage(kind, puts[-1]))
    recovered = make_store(copy)
    assert recovered.max_phy_offset() == end == puts[-1].end
    assert _snapshot(recovered) == before
    _assert_all_there(recovered, puts)
    _assert_puts_continue(recovered, puts)


@pytest.mark.parametrize(
    ("n", "index_files"),
    [
        pytest.param(60, 1, id="one index file"),
        # 255 entries a file, 2 keys a message: message 127's keys straddle files 1 and 2.
        pytest.param(200, 2, id="the index file before the last ends in the middle of a message's keys"),
        pytest.param(300, 3, id="the index file before the last ends with a whole message"),
    ],
)
def test_a_last_record_with_a_bad_body_crc_is_dropped_with_its_queue_unit_and_index_entry(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int, n: int, index_files: int
) -> None:
    store = make_store()
    puts = _put_many(store, n, random.Random(seed))
    assert store.index is not None
    assert len(store.index.files) == index_files
    last = puts[-1]
    copy = _crash_copy(store, tmp_path / "crashed")
    body_at = last.offset + 88 + 3  # a byte inside the body
    with open(_log_file(copy, body_at), "r+b") as f:
        f.seek(body_at % FILE_SIZE)
        byte = f.read(1)
        f.seek(body_at % FILE_SIZE)
        f.write(bytes([byte[0] ^ 0x40]))
    recovered = make_store(copy)
    assert recovered.max_phy_offset() == last.offset
    assert recovered.look_message_by_offset(last.offset) is None
    assert recovered.max_offset_in_queue(last.topic, last.queue_id) == last.queue_offset
    r = recovered.get_message(last.topic, last.queue_id, last.queue_offset, 32)
    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    assert recovered.query_message(last.topic, last.key) == []
    assert recovered.query_message(last.topic, last.uniq_key) == []
    _assert_all_there(recovered, puts[:-1])
    _assert_puts_continue(recovered, puts[:-1])
    # The new message that took the dropped record's place is not mistaken for it.
    assert recovered.query_message(last.topic, last.key) == []


def test_a_last_record_whose_properties_were_torn_is_dropped(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int
) -> None:
    """A page holding the record's header and body reached the disk, the next page (its
    properties) did not: the record is not whole and must not be served."""
    store = make_store()
    puts = _put_many(store, 60, random.Random(seed))
    last = puts[-1]
    copy = _crash_copy(store, tmp_path / "crashed")
    torn_from = last.end - 12  # inside the properties
    _patch(_log_file(copy, torn_from), torn_from % FILE_SIZE, bytes(12))
    recovered = make_store(copy)
    got = recovered.look_message_by_offset(last.offset)
    assert got is None, f"a torn record was kept, with properties {got.properties if got else None}"
    assert recovered.max_phy_offset() == last.offset
    assert recovered.max_offset_in_queue(last.topic, last.queue_id) == last.queue_offset
    _assert_all_there(recovered, puts[:-1])


# --- lost or damaged index files --------------------------------------------------------------


@pytest.mark.parametrize("stop", ["crash", "clean shutdown"])
def test_a_deleted_consumequeue_directory_is_rebuilt_from_the_log_identically(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int, stop: str
) -> None:
    store = make_store()
    puts = _put_many(store, 200, random.Random(seed))
    before = _snapshot(store)
    copy = (_crash_copy if stop == "crash" else _clean_copy)(store, tmp_path / "copy")
    shutil.rmtree(os.path.join(copy, "consumequeue"))
    recovered = make_store(copy)
    assert _snapshot(recovered) == before
    _assert_all_there(recovered, puts)
    _assert_puts_continue(recovered, puts)


@pytest.mark.parametrize("stop", ["crash", "clean shutdown"])
def test_a_deleted_index_directory_is_rebuilt_so_queries_by_key_still_work(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int, stop: str
) -> None:
    store = make_store()
    puts = _put_many(store, 200, random.Random(seed))
    copy = (_crash_copy if stop == "crash" else _clean_copy)(store, tmp_path / "copy")
    shutil.rmtree(os.path.join(copy, "index"))
    recovered = make_store(copy)
    for p in puts:
        assert [m.commit_log_offset for m in recovered.query_message(p.topic, p.key)] == [p.offset]
        assert [m.commit_log_offset for m in recovered.query_message(p.topic, p.uniq_key)] == [p.offset]


def test_a_corrupt_checkpoint_makes_recovery_scan_the_whole_log_and_still_get_it_right(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int
) -> None:
    store = make_store()
    puts = _put_many(store, 250, random.Random(seed), min_files=3)
    before = _snapshot(store)
    copy = _crash_copy(store, tmp_path / "crashed")
    checkpoint = os.path.join(copy, "checkpoint")
    with open(checkpoint, "r+b") as f:
        raw = f.read(52)
        f.seek(30)
        f.write(bytes([raw[30] ^ 0x01]))
    assert not StoreCheckpoint.load(checkpoint).valid
    recovered = make_store(copy)
    assert _snapshot(recovered) == before
    _assert_all_there(recovered, puts)
    cp = StoreCheckpoint.load(checkpoint)
    assert cp.valid, "recovery writes a fresh checkpoint"
    assert cp.physic_offset == recovered.max_phy_offset()
    _assert_puts_continue(recovered, puts)


def _where_in_record(puts: list[Put], cut: int) -> str:
    """Which part of which record a cut falls in (for failure messages)."""
    for p in puts:
        if p.offset < cut < p.end:
            body_len = int.from_bytes(p.record[84:88], "big")
            topic_at = 88 + body_len
            props_at = topic_at + 1 + p.record[topic_at] + 2
            at = cut - p.offset
            parts = [(88, "header"), (topic_at, "body"), (props_at - 2, "topic"), (props_at, "properties length")]
            part = next((name for limit, name in parts if at < limit), "properties")
            return f", {at} bytes into the record at {p.offset} ({p.size} bytes): in its {part}"
    return ", between records"


# --- randomized cuts --------------------------------------------------------------------------


def test_a_log_cut_at_a_random_byte_keeps_every_whole_record_and_shows_none_after_the_cut(
    make_store: Callable[..., MessageStore], tmp_path: Path, seed: int
) -> None:
    """The last CommitLog file loses everything from a random byte on (its size stays: files
    are created at full size, a crash leaves zeros where writes did not reach the disk)."""
    rng = random.Random(seed)
    for round_ in range(6):
        store = make_store(str(tmp_path / f"store-{round_}"))
        puts = _put_many(store, rng.randint(60, 260), rng, tag=f"r{round_}")
        end = store.max_phy_offset()
        copy = _crash_copy(store, tmp_path / f"crashed-{round_}")
        store.shutdown()
        last_start = _last_file_start(copy)
        cut = rng.randint(last_start, end)
        path = os.path.join(copy, "commitlog", f"{last_start:020d}")
        _patch(path, cut - last_start, bytes(FILE_SIZE - (cut - last_start)))

        recovered = make_store(copy)
        kept = [p for p in puts if p.end <= cut]
        lost = [p for p in puts if p.end > cut]
        context = f"round {round_}: cut at {cut}, log ended at {end}" + _where_in_record(puts, cut)
        assert recovered.max_phy_offset() == max([last_start, *(p.end for p in kept)]), context
        for p in kept:
            r = recovered.get_message(p.topic, p.queue_id, p.queue_offset, 1)
            assert r.status is GetMessageStatus.FOUND, context
            assert bytes(r.messages[0]) == p.record, context
            r.messages[0].release()
        for topic, queue_id in QUEUES:
            _, hi, units = _queue_state(recovered, topic, queue_id)
            assert hi == sum(1 for p in kept if (p.topic, p.queue_id) == (topic, queue_id)), context
            assert all(offset + len(record) <= cut for _, offset, record in units), context
        for p in lost:
            assert recovered.look_message_by_offset(p.offset) is None, context
            assert recovered.query_message(p.topic, p.key) == [], context
        recovered.shutdown()
