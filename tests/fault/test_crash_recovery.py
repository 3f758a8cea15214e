"""Crash recovery: kill -9 a SYNC_FLUSH writer at a random point, maybe tear the log's tail, recover.

The promise under test: with SYNC_FLUSH, every message whose put answered PUT_OK is readable
byte for byte after recovery — by id, by queue offset and by key — and the recovered store is
consistent: the log ends exactly where its sound records end, every ConsumeQueue unit points at
a sound record of its queue, no index entry points past the log's end, and appends carry on
with the next queue offsets.

``crash_writer.py`` (a subprocess) writes and prints one ``ACK`` line per PUT_OK. The test kills
it once a seeded number of ACKs arrived, then damages only bytes *after* the last acknowledged
record (those bytes were never fdatasync'ed, so only they can be torn):

* ``kill``: nothing more (the page cache keeps whatever the writer wrote);
* ``torn``: zeros or random bytes from a random point after the last ACK to the end of its file;
* ``truncate``: the last file that holds data is cut short at a random point after the last ACK
  (files after it are lost);
* ``garbage``: random bytes after the last sound record;
* ``flip``: one byte flipped inside a whole record written after the last ACK — recovery must
  end the log right there, before records that follow it.

Every run prints its seed; ``ORBIT_TEST_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, decode_message_id
from data_plane.store.mapped_file import offset_to_file_name
from data_plane.store.message import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, RECORD_HEADER, RecordError, decode_record

pytestmark = pytest.mark.fault

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().with_name("crash_writer.py")

if TYPE_CHECKING:
    from tests.fault import crash_writer
else:  # the writer script, imported by its path whatever sys.path holds (it regenerates messages)
    _spec = importlib.util.spec_from_file_location("crash_writer", WRITER)
    crash_writer = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(crash_writer)
FILE_BYTES = crash_writer.COMMIT_LOG_FILE_BYTES
DEADLINE_S = 60.0
MAGIC_AND_SIZE = struct.Struct(">ii")


@dataclass(frozen=True, slots=True)
class Ack:
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    seq: int

    @property
    def offset(self) -> int:
        return decode_message_id(self.msg_id)[2]


@dataclass(frozen=True, slots=True)
class Entry:
    """A sound record (``blank`` False) or an end-of-file blank record of the raw log."""

    offset: int
    size: int
    blank: bool


# --- the writer process --------------------------------------------------------------------------
class LineReader:
    """Lines of a pipe, read without blocking past a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.lines: list[str] = []
        self.eof = False

    def poll(self, timeout_s: float) -> bool:
        """Read what arrives within ``timeout_s``; False when nothing did."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.fd], [], [], max(timeout_s, 0.0))
        if not ready:
            return False
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        *complete, self.buf = self.buf.split(b"\n")
        self.lines.extend(line.decode() for line in complete)
        return True

    def drain(self) -> None:
        while self.poll(0):
            pass

    def read_to_eof(self, deadline: float) -> None:
        while not self.eof and time.monotonic() < deadline:
            self.poll(deadline - time.monotonic())
        assert self.eof, "the killed writer's stdout did not reach EOF"


def parse_acks(lines: list[str]) -> list[Ack]:
    acks = []
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "ACK":
            _, msg_id, topic, queue_id, queue_offset, seq = parts
            acks.append(Ack(msg_id, topic, int(queue_id), int(queue_offset), int(seq)))
    return acks


def last_seq(lines: list[str]) -> int:
    """The highest message number the writer reported on (ACK or FAIL)."""
    seqs = [0]
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "ACK":
            seqs.append(int(parts[5]))
        elif parts and parts[0] == "FAIL":
            seqs.append(int(parts[1]))
    return max(seqs)


def wait_stopped(pid: int, deadline: float) -> None:
    """Until every thread of ``pid`` is stopped (SIGSTOP is delivered asynchronously)."""
    task_dir = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        states = []
        for task in task_dir.iterdir():
            try:
                stat = (task / "stat").read_text()
            except FileNotFoundError:
                continue  # a thread that just ended
            states.append(stat.rsplit(")", 1)[1].split()[0])
        if states and all(s in "Tt" for s in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"writer {pid} did not stop")


# --- the raw log, read the way a crash left it -----------------------------------------------------
def load_log(store_dir: Path) -> dict[int, bytes]:
    """Every CommitLog file's bytes; a file cut short reads as if zeros followed (what is past
    its end never reached the disk)."""
    cl = store_dir / "commitlog"
    files = {}
    for p in cl.iterdir():
        if p.name.isdigit() and len(p.name) == 20:
            data = p.read_bytes()
            files[int(p.name)] = data + bytes(FILE_BYTES - len(data))
    return files


def walk(files: dict[int, bytes], start: int) -> tuple[list[Entry], int]:
    """Sound records (and blanks) back to back from ``start``, judged independently of the
    store; returns them and the offset where soundness ends."""
    entries: list[Entry] = []
    off = start
    while True:
        base = off - off % FILE_BYTES
        data = files.get(base)
        pos = off - base
        if data is None or pos + 8 > FILE_BYTES:
            break
        total, magic = MAGIC_AND_SIZE.unpack_from(data, pos)
        if magic == BLANK_MAGIC_CODE and total == FILE_BYTES - pos:
            entries.append(Entry(off, total, True))
            off = base + FILE_BYTES
            continue
        if magic != MESSAGE_MAGIC_CODE or total < RECORD_HEADER.size + 3 or pos + total > FILE_BYTES:
            break
        try:
            record = decode_record(data[pos : pos + total])
        except (RecordError, UnicodeDecodeError):
            break
        if record.commit_log_offset != off:
            break
        entries.append(Entry(off, total, False))
        off += total
    return entries, off


def acked_end(files: dict[int, bytes], acks: list[Ack]) -> int:
    """Where the last acknowledged record ends (everything before it was fdatasync'ed)."""
    end = 0
    for a in acks:
        off = a.offset
        data = files[off - off % FILE_BYTES]
        total, magic = MAGIC_AND_SIZE.unpack_from(data, off % FILE_BYTES)
        assert magic == MESSAGE_MAGIC_CODE, f"no record at the offset of acknowledged {a}"
        end = max(end, off + total)
    return end


def write_at(store_dir: Path, offset: int, data: bytes) -> None:
    base = offset - offset % FILE_BYTES
    assert offset % FILE_BYTES + len(data) <= FILE_BYTES
    fd = os.open(store_dir / "commitlog" / offset_to_file_name(base), os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset - base)
        os.fsync(fd)
    finally:
        os.close(fd)


def file_exists(store_dir: Path, offset: int) -> bool:
    return (store_dir / "commitlog" / offset_to_file_name(offset - offset % FILE_BYTES)).exists()


def guarded_positions(size: int, body_len: int) -> list[int]:
    """Bytes of a record whose change recovery must detect: total size, magic, body CRC,
    physical offset, and the body (CRC-32C catches any single changed byte). Other header
    fields (timestamps, flag, queue id ...) are not checksummed, in RocketMQ's format too."""
    body_at = RECORD_HEADER.size
    positions = [*range(12), *range(28, 36), *range(body_at, body_at + body_len)]
    return [p for p in positions if p < size]


# --- the test -------------------------------------------------------------------------------------
VARIANTS = ("kill", "torn", "truncate", "garbage", "flip")


def run_writer_and_kill(
    store_dir: Path, seed: int, allocation: str, rng: random.Random, *, need_tail_record: bool, log_path: Path
) -> list[str]:
    """Start the writer, kill -9 it once a seeded number of ACKs arrived; its stdout lines.
    With ``need_tail_record`` it is first stopped, and killed only once a whole record lies
    after the last acknowledged one (otherwise it resumes for a few more ACKs)."""
    target = rng.randint(1, 3000)
    print(f"[crash] killing the writer after {target} ACKs ({allocation})")
    with open(log_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(store_dir), str(seed), allocation],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=REPO,
        )
    assert proc.stdout is not None
    reader = LineReader(proc.stdout.fileno())
    deadline = time.monotonic() + DEADLINE_S
    try:
        while True:
            while len(parse_acks(reader.lines)) < target:
                assert proc.poll() is None, f"writer exited early ({proc.returncode}): {log_path.read_text()}"
                assert time.monotonic() < deadline, f"only {len(parse_acks(reader.lines))} of {target} ACKs came"
                reader.poll(0.5)
            if not need_tail_record:
                break
            os.kill(proc.pid, signal.SIGSTOP)
            wait_stopped(proc.pid, deadline)
            reader.drain()
            files = load_log(store_dir)
            entries, _ = walk(files, acked_end(files, parse_acks(reader.lines)))
            if any(not e.blank for e in entries):
                break
            os.kill(proc.pid, signal.SIGCONT)
            target = len(parse_acks(reader.lines)) + 1
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        reader.read_to_eof(deadline)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return reader.lines


def damage(store_dir: Path, variant: str, rng: random.Random, acks: list[Ack]) -> tuple[int, int | None]:
    """Damage the log after the last ACK as ``variant`` says; returns (end of the last
    acknowledged record, the offset of the flipped record for ``flip``)."""
    files = load_log(store_dir)
    end_acked = acked_end(files, acks) if acks else 0
    entries, sound_end = walk(files, end_acked)
    records = [e for e in entries if not e.blank]
    print(f"[crash] last ACK ends at {end_acked}; {len(records)} whole records after it, sound to {sound_end}")
    flipped = None
    if variant == "torn":
        # A random point between the last ACK and the end of what was written.
        point = rng.randint(end_acked, sound_end)
        if not file_exists(store_dir, point):
            point = end_acked
        room = FILE_BYTES - point % FILE_BYTES
        if rng.random() < 0.5:
            data = bytes(room)
            print(f"[crash] zeroing from {point} to the end of its file")
        else:
            data = rng.randbytes(rng.randint(1, room))
            print(f"[crash] {len(data)} random bytes at {point}")
        write_at(store_dir, point, data)
    elif variant == "truncate":
        # The filesystem lost the end of the last file that holds data (and any file after it).
        cl = store_dir / "commitlog"
        base = max(b for b, data in files.items() if data.rstrip(b"\0"))
        for b in files:
            if b > base:
                (cl / offset_to_file_name(b)).unlink()
        lo = max(end_acked, base)
        written_upto = base + len(files[base].rstrip(b"\0"))
        point = rng.randint(lo, max(lo, written_upto))
        os.truncate(cl / offset_to_file_name(base), point - base)
        print(f"[crash] file {base} cut to {point - base} bytes (data ran to {written_upto})")
    elif variant == "garbage":
        point = sound_end
        if not file_exists(store_dir, point):
            # The writer died between filling a file and making the next: overwrite the blank.
            assert entries
            assert entries[-1].blank
            point = entries[-1].offset
        room = FILE_BYTES - point % FILE_BYTES
        data = rng.randbytes(rng.randint(1, min(room, 8192)))
        print(f"[crash] {len(data)} random bytes at {point}")
        write_at(store_dir, point, data)
    elif variant == "flip":
        assert records, "the writer was killed with a whole record after the last ACK"
        victim = rng.choice(records)
        base = victim.offset - victim.offset % FILE_BYTES
        body_len = struct.unpack_from(">i", files[base], victim.offset - base + RECORD_HEADER.size - 4)[0]
        at = victim.offset + rng.choice(guarded_positions(victim.size, body_len))
        old = files[base][at - base]
        write_at(store_dir, at, bytes([old ^ rng.randint(1, 255)]))
        print(f"[crash] flipped the byte at {at}, inside the record at {victim.offset} ({victim.size} bytes)")
        flipped = victim.offset
    return end_acked, flipped


def check_acked(store: MessageStore, seed: int, acks: list[Ack]) -> None:
    """Every acknowledged message: same bytes by id, by queue offset, and found by its keys."""
    for a in acks:
        want = crash_writer.make_message(seed, a.seq)
        got = store.view_message_by_id(a.msg_id)
        assert got is not None, f"acknowledged {a} is gone after recovery"
        assert got.body == want.body, f"acknowledged {a}: body differs after recovery"
        assert (got.topic, got.queue_id, got.queue_offset) == (a.topic, a.queue_id, a.queue_offset), a
        assert (got.topic, got.queue_id) == (want.topic, want.queue_id), a
        assert got.properties["KEYS"] == want.properties["KEYS"]
        assert got.properties["UNIQ_KEY"] == want.properties["UNIQ_KEY"]
        r = store.get_message(a.topic, a.queue_id, a.queue_offset, 1)
        assert r.status is GetMessageStatus.FOUND, (a, r.status)
        raw = store.read_record(a.offset)
        assert raw is not None
        assert bytes(r.messages[0]) == bytes(raw), f"queue offset {a.queue_offset} of {a} reads another record"
        key, uniq = crash_writer.message_keys(seed, a.seq)
        for k in (key, uniq):
            found = store.query_message(a.topic, k)
            assert [m.commit_log_offset for m in found] == [a.offset], (a, k)


def check_consistent(store: MessageStore, files: dict[int, bytes]) -> set[int]:
    """The log holds exactly its sound records, and every ConsumeQueue unit of every queue
    points at one of them, of its queue, at its queue offset. Returns the records' offsets."""
    entries, end = walk(files, 0)
    assert store.min_phy_offset() == 0
    assert store.max_phy_offset() == end
    log_records = {e.offset for e in entries if not e.blank}
    assert store.topics() <= set(crash_writer.TOPICS)
    indexed: set[int] = set()
    for topic in crash_writer.TOPICS:
        for q in range(crash_writer.QUEUES_PER_TOPIC):
            lo, hi = store.min_offset_in_queue(topic, q), store.max_offset_in_queue(topic, q)
            assert lo == 0, (topic, q, lo)
            offset = lo
            while offset < hi:
                r = store.get_message(topic, q, offset, 32)
                assert r.status is GetMessageStatus.FOUND, (topic, q, offset, r.status)
                assert r.queue_offsets == list(range(offset, offset + len(r.messages))), (topic, q, offset)
                for qo, raw in zip(r.queue_offsets, r.messages, strict=True):
                    m = decode_record(raw)
                    assert m.total_size == len(raw), (topic, q, qo)
                    assert (m.topic, m.queue_id, m.queue_offset) == (topic, q, qo)
                    assert m.commit_log_offset not in indexed, f"two units point at {m.commit_log_offset}"
                    assert store.commit_log_offset_in_queue(topic, q, qo) == m.commit_log_offset
                    indexed.add(m.commit_log_offset)
                offset = r.next_begin_offset
            assert store.get_message(topic, q, hi, 1).status in (
                GetMessageStatus.OFFSET_OVERFLOW_ONE,
                GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
            )
    assert indexed == log_records, (
        f"{len(log_records - indexed)} log records without a unit, {len(indexed - log_records)} units without a record"
    )
    return log_records


def check_index_bounded(store: MessageStore, seed: int, last_seq: int) -> None:
    """No index entry, for any key the writer may have written, points at or past the log's end."""
    assert store.index is not None
    end = store.max_phy_offset()
    for seq in range(last_seq + 64):
        topic = crash_writer.make_message(seed, seq).topic
        for k in crash_writer.message_keys(seed, seq):
            for phy in store.index.query(topic, k, 64, 0, 2**62):
                assert phy < end, f"index entry for {topic}#{k} points at {phy}, past the log end {end}"
                assert store.read_record(phy) is not None, f"index entry for {topic}#{k}: no record at {phy}"


def check_appends_continue(store: MessageStore, seed: int) -> list[tuple[str, Message]]:
    """One more message on every queue: the next queue offset, no gap, no duplicate."""
    before = {
        (t, q): store.max_offset_in_queue(t, q)
        for t in crash_writer.TOPICS
        for q in range(crash_writer.QUEUES_PER_TOPIC)
    }
    log_end = store.max_phy_offset()
    msgs = [
        Message(topic=t, body=f"after recovery {seed} {t} {q}".encode(), queue_id=q, properties={"KEYS": f"after-{q}"})
        for (t, q) in before
    ]

    async def put_all() -> list[tuple[str, Message]]:
        out = []
        for m in msgs:
            r = await store.put_message(m)
            assert r.status is PutMessageStatus.PUT_OK, r
            assert r.append is not None
            assert r.append.queue_offset == before[(m.topic, m.queue_id)], (m.topic, m.queue_id, r)
            assert r.append.wrote_offset >= log_end, "an append after recovery overwrote the recovered log"
            out.append((r.append.msg_id, m))
        return out

    written = asyncio.run(put_all())
    for (t, q), n in before.items():
        assert store.max_offset_in_queue(t, q) == n + 1
    return written


def check_written(store: MessageStore, written: list[tuple[str, Message]]) -> None:
    for msg_id, m in written:
        got = store.view_message_by_id(msg_id)
        assert got is not None
        assert (got.body, got.topic, got.queue_id) == (m.body, m.topic, m.queue_id)
        r = store.get_message(m.topic, m.queue_id, got.queue_offset, 1)
        assert r.status is GetMessageStatus.FOUND
        assert decode_record(r.messages[0]).body == m.body


@pytest.mark.parametrize("allocation", crash_writer.ALLOCATION)
@pytest.mark.parametrize("variant", VARIANTS)
def test_sync_flush_acked_messages_survive_kill_9_and_torn_tail(
    tmp_path: Path, seed: int, variant: str, allocation: str
) -> None:
    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    lines = run_writer_and_kill(
        store_dir, seed, allocation, rng, need_tail_record=variant == "flip", log_path=tmp_path / "writer.stderr"
    )
    acks = parse_acks(lines)
    assert acks, "the writer acknowledged nothing"
    assert len({a.msg_id for a in acks}) == len(acks)
    assert len({(a.topic, a.queue_id, a.queue_offset) for a in acks}) == len(acks)
    end_acked, flipped = damage(store_dir, variant, rng, acks)
    # What recovery must find: the sound records from the log's start, judged before it runs.
    entries, sound_end = walk(load_log(store_dir), 0)
    sound_records = {e.offset for e in entries if not e.blank}
    assert sound_end >= end_acked, "the test damaged an acknowledged record"
    if flipped is not None:
        assert sound_end == flipped

    config = crash_writer.writer_config(str(store_dir), preallocate=allocation == "preallocate")
    store = MessageStore(config)
    store.start()  # recovery
    try:
        assert store.recovered_abnormally, "kill -9 left the abort file: recovery must know it crashed"
        assert store.max_phy_offset() >= end_acked, "recovery cut into acknowledged records"
        assert store.max_phy_offset() == sound_end, "recovery must end the log where its sound records end"
        assert check_consistent(store, load_log(store_dir)) == sound_records
        check_acked(store, seed, acks)
        check_index_bounded(store, seed, last_seq(lines))
        written = check_appends_continue(store, seed)
        check_written(store, written)
        check_acked(store, seed, acks)
    finally:
        store.shutdown()

    # A clean restart after all that keeps everything.
    store = MessageStore(config)
    store.start()
    try:
        assert not store.recovered_abnormally
        check_consistent(store, load_log(store_dir))
        check_acked(store, seed, acks)
        check_written(store, written)
    finally:
        store.shutdown()
