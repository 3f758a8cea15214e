"""Disk full, on a real (small) filesystem: an 8 MiB tmpfs mounted for each test.

The promise: a full disk gets a clear status (DISK_FULL, with a reason) — no exception, no
crash, no SIGBUS; the store stays consistent and readable; writes resume once space returns
(``clean_once``) and a restart recovers everything. And retention, driven by the filesystem's
real usage: under pressure only files past retention go, over the write watermark writes are
refused until usage drops, and only past the emergency watermark do files inside retention go.

A restart while the disk is still full runs in a child process (this module, run as a script),
so that a SIGBUS fails the test instead of killing the test run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script (the child process): make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pytest

from data_plane.store import (
    GetMessageStatus,
    Message,
    MessageStore,
    PutMessageResult,
    PutMessageStatus,
    StoreConfig,
    decode_message_id,
)
from data_plane.store.mapped_file import offset_to_file_name
from data_plane.store.message import decode_record
from data_plane.store.retention import ForcedDeletion

pytestmark = pytest.mark.fault

FS_BYTES = 8 * 1024 * 1024
FILE_BYTES = 1024 * 1024
MAX_MESSAGE_BYTES = 64 * 1024
TOPICS = ("FullA", "FullB")
QUEUES = 4
REPO = Path(__file__).resolve().parents[2]

Written = list[tuple[str, Message]]  # (msg id, message) of every put that answered PUT_OK


def mounted_tmpfs(mnt: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a fresh tmpfs of ``size_bytes`` on ``mnt`` (skip when that is not allowed); unmount
    it afterwards, lazily if something still holds it."""
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as e:
        pytest.skip(f"cannot mount a tmpfs: {e}")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (mount exited {r.returncode}, needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs."""
    yield from mounted_tmpfs(tmp_path / "tmpfs", FS_BYTES)


@pytest.fixture
def open_store(tmpfs: Path) -> Iterator[Callable[[StoreConfig], MessageStore]]:
    """Start stores on the tmpfs; every one is shut down before the tmpfs is unmounted."""
    made: list[MessageStore] = []

    def open_(config: StoreConfig) -> MessageStore:
        store = MessageStore(config)
        store.start()
        made.append(store)
        return store

    yield open_
    for store in made:
        store.shutdown()


def full_config(store_path: Path, **changes: Any) -> StoreConfig:
    base: dict[str, Any] = {
        "store_path": str(store_path),
        "commit_log_file_size_bytes": FILE_BYTES,
        "max_message_size_bytes": MAX_MESSAGE_BYTES,
        "consume_queue_units_per_file": 1024,
        "index_hash_slots": 256,
        "index_max_entries": 1024,
        "flush_interval_commit_log_ms": 50,
        "flush_interval_consume_queue_ms": 50,
        # Retention never frees space by itself: only the test does.
        "disk_max_used_space_ratio": 1.0,
        "disk_space_clean_forcibly_ratio": 1.0,
        "disk_space_warning_level_ratio": 1.0,
    }
    base.update(changes)
    return StoreConfig(**base)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def usage(path: Path) -> float:
    st = os.statvfs(path)
    return 1.0 - st.f_bavail / st.f_blocks


def fill(path: Path, leave_bytes: int) -> None:
    """Write a file that leaves about ``leave_bytes`` free on the filesystem of ``path``."""
    size = free_bytes(path.parent) - leave_bytes
    assert size > 0, f"only {free_bytes(path.parent)} bytes free, cannot leave {leave_bytes}"
    chunk = bytes(1 << 20)
    with open(path, "wb") as f:
        while size > 0:
            size -= f.write(chunk[: min(size, len(chunk))])


def wait_for_preallocation(store: MessageStore, timeout_s: float = 10.0) -> None:
    """Until the CommitLog file after the current one has all its blocks (the allocator thread
    makes it after start and at each rollover), so that the test alone decides what fills the
    disk."""
    if not store.config.preallocate_next_file:
        return
    size = store.config.commit_log_file_size_bytes
    last = store.commit_log.mfq.files[-1]
    following = Path(last.path).with_name(offset_to_file_name(last.file_from_offset + size))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if following.exists() and following.stat().st_blocks * 512 >= size:
            return
        time.sleep(0.01)
    raise AssertionError(f"the allocator did not make {following} within {timeout_s} s")


def random_message(rng: random.Random, n: int) -> Message:
    roll = rng.random()
    size = rng.randint(40_000, MAX_MESSAGE_BYTES - 1024) if roll < 0.1 else rng.randint(1, 16 * 1024)
    return Message(
        topic=rng.choice(TOPICS),
        body=rng.randbytes(size),
        queue_id=rng.randrange(QUEUES),
        properties={"KEYS": f"key-{n}", "UNIQ_KEY": f"uniq-{n:08d}"},
    )


def put(store: MessageStore, msg: Message) -> PutMessageResult:
    async def go() -> PutMessageResult:
        return await store.put_message(msg)

    return asyncio.run(go())


def put_until_disk_full(store: MessageStore, rng: random.Random, written: Written) -> PutMessageResult:
    """Put messages until one is refused; that refusal must be DISK_FULL, with a reason."""
    for _ in range(10_000):
        msg = random_message(rng, len(written))
        r = put(store, msg)
        if r.status is PutMessageStatus.PUT_OK:
            assert r.append is not None
            written.append((r.append.msg_id, msg))
            continue
        assert r.status is PutMessageStatus.DISK_FULL, r
        assert r.reason, "DISK_FULL must say why"
        return r
    raise AssertionError(f"{len(written)} puts and the disk is still not full")


def put_across_a_file(store: MessageStore, rng: random.Random, written: Written) -> None:
    """Put messages until the log has moved into its next CommitLog file; all must succeed."""
    start_file = store.max_phy_offset() // FILE_BYTES
    while store.max_phy_offset() // FILE_BYTES == start_file:
        msg = random_message(rng, len(written))
        r = put(store, msg)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        written.append((r.append.msg_id, msg))


def check_readable(store: MessageStore, written: Written, *, unindexed_tail: int = 0) -> None:
    """Every PUT_OK message by id; every queue holds exactly its PUT_OK messages, in order; keys
    find them. The last ``unindexed_tail`` messages may still lack their ConsumeQueue unit and
    index entries (written to the log while an index could not grow)."""
    for msg_id, m in written:
        got = store.view_message_by_id(msg_id)
        assert got is not None, f"{msg_id} answered PUT_OK and cannot be read"
        assert (got.topic, got.queue_id, got.body, got.properties["KEYS"]) == (
            m.topic,
            m.queue_id,
            m.body,
            m.properties["KEYS"],
        )
    indexed = written[: len(written) - unindexed_tail]
    for topic in TOPICS:
        for q in range(QUEUES):
            want = [decode_message_id(i)[2] for i, m in written if (m.topic, m.queue_id) == (topic, q)]
            must = [decode_message_id(i)[2] for i, m in indexed if (m.topic, m.queue_id) == (topic, q)]
            got_offsets: list[int] = []
            offset = store.min_offset_in_queue(topic, q)
            assert offset == 0
            while True:
                r = store.get_message(topic, q, offset, 32)
                if r.status is not GetMessageStatus.FOUND:
                    break
                for raw in r.messages:
                    rec = decode_record(raw)
                    assert (rec.topic, rec.queue_id) == (topic, q)
                    got_offsets.append(rec.commit_log_offset)
                offset = r.next_begin_offset
            assert got_offsets in (want, must) if unindexed_tail else got_offsets == want, (topic, q)
    for msg_id, m in indexed:
        found = store.query_message(m.topic, m.properties["KEYS"])
        assert [x.msg_id for x in found] == [msg_id]


def run_child(what: str, *args: str) -> dict[str, Any]:
    """Run this file as a child process (so that a SIGBUS fails the test, not the whole run)
    and return the JSON report it prints last."""
    child = subprocess.run(
        [sys.executable, "-X", "faulthandler", __file__, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, (
        f"{what} (exit {child.returncode}{', SIGBUS' if child.returncode == -7 else ''}):\n{child.stderr[-4000:]}"
    )
    report: dict[str, Any] = json.loads(child.stdout.splitlines()[-1])
    return report


@pytest.mark.parametrize("preallocate", [False, True], ids=["on-demand", "preallocate"])
def test_disk_full_is_refused_with_a_reason_and_writes_resume_when_space_returns(
    tmpfs: Path, open_store: Callable[[StoreConfig], MessageStore], seed: int, preallocate: bool
) -> None:
    rng = random.Random(seed)
    store = open_store(full_config(tmpfs / "store", preallocate_next_file=preallocate))
    filler = tmpfs / "filler"
    written = fill_store_until_disk_full(store, rng, filler)
    end = store.max_phy_offset()
    # Still full: every further put is refused the same way, and writes nothing.
    for _ in range(3):
        r = put(store, random_message(rng, -1))
        assert r.status is PutMessageStatus.DISK_FULL, r
        assert r.reason
    assert store.max_phy_offset() == end
    check_readable(store, written, unindexed_tail=1 if store.dispatch_broken else 0)

    # Space returns: retention notices, writes resume (across a CommitLog file boundary).
    filler.unlink()
    report = store.clean_once()
    assert not report.disk_full
    put_across_a_file(store, rng, written)
    check_readable(store, written)

    # A restart recovers everything, and writes go on after it.
    store.shutdown()
    store.start()
    check_readable(store, written)
    put_across_a_file(store, rng, written)
    check_readable(store, written)


def fill_store_until_disk_full(store: MessageStore, rng: random.Random, filler: Path) -> Written:
    """A few messages, a filler file leaving a seeded amount of room, then puts until DISK_FULL."""
    written: Written = []
    for _ in range(rng.randint(1, 20)):  # the first file's blocks are reserved by its first write
        msg = random_message(rng, len(written))
        r = put(store, msg)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        written.append((r.append.msg_id, msg))
    wait_for_preallocation(store)
    fill(filler, rng.randint(FILE_BYTES // 2, 3 * FILE_BYTES))
    put_until_disk_full(store, rng, written)
    return written


@pytest.mark.parametrize("preallocate", [False, True], ids=["on-demand", "preallocate"])
def test_a_restart_while_the_disk_is_full_recovers_and_stays_readable(
    tmpfs: Path, open_store: Callable[[StoreConfig], MessageStore], tmp_path: Path, seed: int, preallocate: bool
) -> None:
    rng = random.Random(seed)
    config = full_config(tmpfs / "store", preallocate_next_file=preallocate)
    store = open_store(config)
    filler = tmpfs / "filler"
    written = fill_store_until_disk_full(store, rng, filler)
    store.shutdown()

    # Restart on the still-full disk, in a child process: it must not die (SIGBUS included).
    spec = tmp_path / "reopen.json"
    spec.write_text(
        json.dumps(
            {
                "config": {k: getattr(config, k) for k in CHILD_CONFIG_FIELDS},
                "written": [[i, m.topic, m.queue_id, m.body.hex()] for i, m in written],
            }
        )
    )
    report = run_child("restarting on a full disk killed the process", "reopen", str(spec))
    assert report["unreadable"] == [], "messages that answered PUT_OK are not readable after the restart"
    assert report["queue_counts"] == queue_counts(written)
    assert report["put_status"] in ("PUT_OK", "DISK_FULL"), report
    if report["put_status"] == "DISK_FULL":
        assert report["reason"]
    else:
        written.append((report["put_msg_id"], child_probe_message()))

    # Space returns: a new start recovers everything and writes go on.
    filler.unlink()
    store = open_store(config)
    check_readable(store, written)
    put_across_a_file(store, rng, written)
    check_readable(store, written)


# --- retention against the filesystem's real usage ------------------------------------------------
SMALL_FILE_BYTES = 256 * 1024  # 1/32 of the filesystem: usage moves in small, countable steps


def watermark_config(store_path: Path, **changes: Any) -> StoreConfig:
    """Watermarks low enough for an 8 MiB filesystem: pressure at 50 %, writes refused at 60 %,
    the emergency watermark at 70 %; 1 h retention."""
    base: dict[str, Any] = {
        "commit_log_file_size_bytes": SMALL_FILE_BYTES,
        "preallocate_next_file": False,
        "disk_max_used_space_ratio": 0.5,
        "disk_space_warning_level_ratio": 0.6,
        "disk_space_clean_forcibly_ratio": 0.7,
        "file_reserved_time_hours": 1.0,
    }
    base.update(changes)
    return full_config(store_path, **base)


def put_files(store: MessageStore, rng: random.Random, files: int, written: Written) -> None:
    """Put small messages until the log spans ``files`` CommitLog files."""
    size = store.config.commit_log_file_size_bytes
    while store.max_phy_offset() <= (files - 1) * size:
        msg = random_message(rng, len(written))
        msg.body = msg.body[: 16 * 1024]
        r = put(store, msg)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        written.append((r.append.msg_id, msg))


def check_after_retention(store: MessageStore, written: Written) -> None:
    """Messages below the log's new start are gone (by id, by queue, by key); every other one
    reads as before, and each queue now starts at its first surviving message."""
    log_min = store.min_phy_offset()
    for msg_id, m in written:
        gone = decode_message_id(msg_id)[2] < log_min
        got = store.view_message_by_id(msg_id)
        if gone:
            assert got is None, f"{msg_id} lies below the log's start {log_min} and still reads"
        else:
            assert got is not None, f"{msg_id} was not deleted and cannot be read"
            assert got.body == m.body
        assert [x.msg_id for x in store.query_message(m.topic, m.properties["KEYS"])] == ([] if gone else [msg_id])
    for topic in TOPICS:
        for q in range(QUEUES):
            want = [
                off
                for off, m in ((decode_message_id(i)[2], m) for i, m in written)
                if (m.topic, m.queue_id) == (topic, q) and off >= log_min
            ]
            start = store.min_offset_in_queue(topic, q)
            got_offsets: list[int] = []
            offset = start
            while True:
                r = store.get_message(topic, q, offset, 32)
                if r.status is not GetMessageStatus.FOUND:
                    break
                got_offsets.extend(decode_record(raw).commit_log_offset for raw in r.messages)
                offset = r.next_begin_offset
            assert got_offsets == want, (topic, q)
            if start > 0:
                r = store.get_message(topic, q, 0, 1)
                assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
                assert r.next_begin_offset == start


def test_past_the_emergency_watermark_the_oldest_files_go_until_usage_is_under_it_and_are_reported(
    tmpfs: Path, open_store: Callable[[StoreConfig], MessageStore], seed: int
) -> None:
    rng = random.Random(seed)
    store = open_store(watermark_config(tmpfs / "store"))
    forced: list[ForcedDeletion] = []
    store.on_forced_deletion = forced.append
    written: Written = []
    put_files(store, rng, 10, written)
    assert usage(tmpfs) < 0.5
    report = store.clean_once()
    assert report.commit_log_files_deleted == 0, "young files under the watermarks must stay"
    assert store.min_phy_offset() == 0

    filler = tmpfs / "filler"
    fill(filler, int(FS_BYTES * rng.uniform(0.20, 0.26)))  # usage 74 %..80 %
    assert usage(tmpfs) >= 0.7
    report = store.clean_once()
    after = usage(tmpfs)
    assert report.commit_log_files_deleted >= 1
    assert after < 0.7, f"clean_once left the disk {after:.0%} used"
    assert report.disk_usage_ratio < 0.7
    # ... and it stopped as soon as usage was under the watermark.
    assert after + SMALL_FILE_BYTES / FS_BYTES >= 0.7, f"{report.commit_log_files_deleted} files went, more than needed"
    assert store.min_phy_offset() == report.commit_log_files_deleted * SMALL_FILE_BYTES
    # Every file that went was inside retention: counted per topic, and told.
    assert len(report.forced) == report.commit_log_files_deleted
    assert forced == report.forced
    gone = [m for msg_id, m in written if decode_message_id(msg_id)[2] < store.min_phy_offset()]
    assert sum(f.messages for f in report.forced) == len(gone)
    for topic in TOPICS:
        assert sum(f.messages_in_retention.get(topic, 0) for f in report.forced) == sum(m.topic == topic for m in gone)
    assert report.disk_full, "still past the write watermark"
    check_after_retention(store, written)
    filler.unlink()
    assert not store.clean_once().disk_full
    put_files(store, rng, store.max_phy_offset() // SMALL_FILE_BYTES + 2, written)
    check_after_retention(store, written)


def test_under_pressure_only_files_past_retention_go_and_below_it_a_batch_at_a_time(
    tmpfs: Path, open_store: Callable[[StoreConfig], MessageStore], seed: int
) -> None:
    rng = random.Random(seed)
    store = open_store(watermark_config(tmpfs / "store", delete_files_batch_max=3))
    written: Written = []
    put_files(store, rng, 10, written)
    assert usage(tmpfs) < 0.5
    assert store.clean_once(now_s=time.time()).commit_log_files_deleted == 0
    # Under the pressure watermark, files past retention go, a batch at a time.
    report = store.clean_once(now_s=time.time() + 2 * 3600)
    assert report.commit_log_files_deleted == 3
    assert store.min_phy_offset() == 3 * SMALL_FILE_BYTES
    check_after_retention(store, written)

    # Under pressure, files inside retention stay, whatever the use ...
    fill(tmpfs / "filler", int(FS_BYTES * rng.uniform(0.42, 0.48)))  # usage 52 %..58 %
    assert 0.5 <= usage(tmpfs) < 0.6
    report = store.clean_once(now_s=time.time())
    assert report.commit_log_files_deleted == 0
    assert not report.disk_full
    # ... and every file past retention goes in one round (all but the one being written).
    files = len(store.commit_log.mfq.files)
    report = store.clean_once(now_s=time.time() + 2 * 3600)
    assert report.commit_log_files_deleted == files - 1
    assert report.forced == []
    check_after_retention(store, written)


def test_over_the_write_watermark_puts_are_refused_nothing_inside_retention_goes_until_usage_drops(
    tmpfs: Path, open_store: Callable[[StoreConfig], MessageStore], seed: int
) -> None:
    rng = random.Random(seed)
    store = open_store(watermark_config(tmpfs / "store"))
    written: Written = []
    put_files(store, rng, 3, written)
    filler = tmpfs / "filler"
    fill(filler, int(FS_BYTES * rng.uniform(0.32, 0.38)))  # usage 62 %..68 %
    assert 0.6 <= usage(tmpfs) < 0.7
    report = store.clean_once()
    assert report.disk_full, f"{report.disk_usage_ratio:.0%} used is over the 60 % write watermark"
    assert report.commit_log_files_deleted == 0, "under the emergency watermark nothing inside retention goes"
    end = store.max_phy_offset()
    for _ in range(3):
        r = put(store, random_message(rng, -1))
        assert r.status is PutMessageStatus.DISK_FULL, r
        assert "disk_space_warning_level_ratio" in r.reason
    assert store.max_phy_offset() == end
    assert store.min_phy_offset() == 0
    check_after_retention(store, written)

    filler.unlink()
    report = store.clean_once()
    assert not report.disk_full
    put_files(store, rng, store.max_phy_offset() // SMALL_FILE_BYTES + 2, written)
    check_after_retention(store, written)


# --- the disk filled by someone else while the store runs ------------------------------------------
BIG_FS_BYTES = 72 * 1024 * 1024  # room for a CommitLog file plus the store's 64 MiB free-space margin


@pytest.fixture
def big_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 72 MiB tmpfs: enough free space that the store trusts it when it makes a file."""
    yield from mounted_tmpfs(tmp_path / "big-tmpfs", BIG_FS_BYTES)


@pytest.mark.parametrize("preallocate", [False, True], ids=["on-demand", "preallocate"])
def test_a_disk_filled_by_another_process_is_refused_not_a_crash(big_tmpfs: Path, seed: int, preallocate: bool) -> None:
    """The store made its CommitLog file while the disk had plenty of room; then another
    process takes every block. Puts must answer DISK_FULL — not die of SIGBUS writing through
    the mapping — and resume once the space is back. (Populating the mapping ahead of the
    writer is off: it is an optimisation, absent without the compiled module, not a guard.)
    Runs in a child process so that a SIGBUS fails this test, not the whole run."""
    report = run_child(
        "the store's process died when another process filled the disk",
        "filled-later", str(big_tmpfs), str(seed), str(preallocate),
    )  # fmt: skip
    assert report["refused_status"] == "DISK_FULL", report
    assert report["refused_reason"]
    assert report["put_ok"] > 0
    assert report["unreadable"] == 0
    assert report["resumed_status"] == "PUT_OK", report


def filled_later_in_child(mnt: str, seed: int, preallocate: bool) -> int:
    """Child process of the test above; prints a JSON report on its last line."""
    rng = random.Random(seed)
    mount = Path(mnt)
    config = full_config(
        mount / "store",
        commit_log_file_size_bytes=4 * FILE_BYTES,
        preallocate_next_file=preallocate,
    )
    store = MessageStore(config)
    store.start()
    written: Written = []
    for topic in TOPICS:  # every queue exists (and its ConsumeQueue has room) before the disk fills
        for q in range(QUEUES):
            msg = random_message(rng, len(written))
            msg.topic, msg.queue_id = topic, q
            r = put(store, msg)
            assert r.ok, r
            assert r.append is not None
            written.append((r.append.msg_id, msg))
    wait_for_preallocation(store)
    filler = mount / "another-process"
    fill(filler, 0)
    refused = put_until_disk_full(store, rng, written)
    unreadable = 0
    for msg_id, m in written:
        got = store.view_message_by_id(msg_id)
        unreadable += got is None or got.body != m.body
    filler.unlink()
    store.clean_once()
    resumed = put(store, random_message(rng, len(written)))
    store.shutdown()
    report = {
        "put_ok": len(written),
        "refused_status": refused.status.value,
        "refused_reason": refused.reason,
        "unreadable": unreadable,
        "resumed_status": resumed.status.value,
    }
    print(json.dumps(report))
    return 0


CHILD_CONFIG_FIELDS = (
    "store_path",
    "commit_log_file_size_bytes",
    "max_message_size_bytes",
    "consume_queue_units_per_file",
    "index_hash_slots",
    "index_max_entries",
    "flush_interval_commit_log_ms",
    "flush_interval_consume_queue_ms",
    "disk_max_used_space_ratio",
    "disk_space_clean_forcibly_ratio",
    "disk_space_warning_level_ratio",
    "preallocate_next_file",
)


def queue_counts(written: Written) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, m in written:
        key = f"{m.topic}/{m.queue_id}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def child_probe_message() -> Message:
    return Message(
        topic=TOPICS[0], body=b"put after a restart on a full disk", queue_id=0, properties={"KEYS": "probe"}
    )


def reopen_in_child(spec_path: str) -> int:
    """Child process: start the store (recovery) on the full disk, read every message that
    answered PUT_OK, try one put; print a JSON report on the last line."""
    spec = json.loads(Path(spec_path).read_text())
    store = MessageStore(StoreConfig(**spec["config"]))
    store.start()
    unreadable = []
    for msg_id, topic, queue_id, body_hex in spec["written"]:
        got = store.view_message_by_id(msg_id)
        if got is None or (got.topic, got.queue_id, got.body.hex()) != (topic, queue_id, body_hex):
            unreadable.append(msg_id)
    counts = {}
    for topic, queue_id in sorted({(t, q) for _, t, q, _ in spec["written"]}):
        counts[f"{topic}/{queue_id}"] = store.max_offset_in_queue(topic, queue_id) - store.min_offset_in_queue(
            topic, queue_id
        )
    r = put(store, child_probe_message())
    store.shutdown()
    report = {
        "unreadable": unreadable,
        "queue_counts": counts,
        "put_status": r.status.value,
        "reason": r.reason,
        "put_msg_id": r.append.msg_id if r.ok and r.append is not None else None,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["reopen"]:
        sys.exit(reopen_in_child(sys.argv[2]))
    if sys.argv[1:2] == ["filled-later"]:
        sys.exit(filled_later_in_child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "True"))
    sys.exit(f"usage: {sys.argv[0]} reopen <spec.json> | filled-later <mount> <seed> <preallocate>")


def test_reserving_index_blocks_ahead_on_a_full_disk_warns_once_and_keeps_the_store_readable(
    tmpfs: Path, open_store: Callable[[StoreConfig], MessageStore], caplog: pytest.LogCaptureFixture
) -> None:
    """The flush thread's reserve-ahead (StoreConfig.reserve_indexes_ahead_s) meets ENOSPC: a
    warning, not an exception out of the flush round, and not one warning per round; the
    messages stored stay readable. (Rounds are called here; the thread's first is a minute off.)"""
    store = open_store(
        full_config(tmpfs / "store", flush_interval_consume_queue_ms=60_000, reserve_indexes_ahead_s=60.0)
    )
    written: Written = []
    for i in range(400):
        msg = Message(topic=TOPICS[0], body=b"r" * 100, queue_id=i % 2, properties={"KEYS": f"k{i}"})
        r = put(store, msg)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        written.append((r.append.msg_id, msg))
    wait_for_preallocation(store)
    fill(tmpfs / "filler", 0)
    queues = [store.queues.get(TOPICS[0], q) for q in (0, 1)]
    with caplog.at_level("WARNING", logger="data_plane.store.index_flush"):
        for cq in queues:  # each has a round's worth to reserve, and no room for it
            assert cq is not None
            store.reserve_indexes_ahead([cq])
    warnings = [r for r in caplog.records if "cannot reserve index blocks ahead" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "No space left" in warnings[0].getMessage()
    check_readable(store, written)
