"""data_plane/tenancy/usage_spool.py: durable, bounded, compacted; across restarts every record is
read until acknowledged and never after."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import orjson
import pytest

from data_plane.tenancy import usage_spool
from data_plane.tenancy.metering import UsageRecord
from data_plane.tenancy.usage_spool import SPOOL_FILE, STATE_FILE, SpoolStatus, UsageSpool

pytestmark = pytest.mark.unit


def rec(i: int, tenant: str = "acme") -> UsageRecord:
    minute = 1_700_000_040_000 + i * 60_000
    return {
        "report_id": f"b:{minute}:{tenant}",
        "broker": "b",
        "tenant": tenant,
        "minute": minute,
        "requests_4k": i,
        "bytes_in": i * 10,
        "bytes_out": 0,
        "stored_bytes": 0,
    }


def ids(records: list[UsageRecord]) -> list[str]:
    return [r["report_id"] for r in records]


def test_records_are_read_in_order_until_acknowledged(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path))
    assert spool.read_batch(10) is None
    assert spool.append([rec(i) for i in range(5)]) is SpoolStatus.OK
    assert spool.pending == 5
    batch = spool.read_batch(3)
    assert batch is not None
    assert ids(batch.records) == ids([rec(0), rec(1), rec(2)])
    assert (batch.first_seq, batch.last_seq) == (1, 3)
    again = spool.read_batch(3)  # not acknowledged: read again
    assert again is not None
    assert ids(again.records) == ids(batch.records)
    spool.ack(batch)
    assert spool.pending == 2
    rest = spool.read_batch(10)
    assert rest is not None
    assert ids(rest.records) == ids([rec(3), rec(4)])
    spool.ack(rest)
    assert spool.read_batch(10) is None
    assert spool.pending == 0


def test_the_file_is_json_lines_and_the_state_names_the_acknowledged_seq(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path))
    spool.append([rec(1), rec(2)])
    lines = (tmp_path / SPOOL_FILE).read_bytes().splitlines()
    assert [orjson.loads(line) for line in lines] == [{"seq": 1, "record": rec(1)}, {"seq": 2, "record": rec(2)}]
    batch = spool.read_batch(1)
    assert batch is not None
    spool.ack(batch)
    assert orjson.loads((tmp_path / STATE_FILE).read_bytes()) == {"acked_seq": 1, "last_minute": rec(2)["minute"]}


def test_a_restart_reads_what_was_not_acknowledged_and_nothing_else(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path), compact_min_bytes=1 << 30)  # no compaction: acked lines stay
    spool.append([rec(i) for i in range(6)])
    batch = spool.read_batch(4)
    assert batch is not None
    spool.ack(batch)
    spool.close()
    reopened = UsageSpool(str(tmp_path))
    assert reopened.pending == 2
    batch = reopened.read_batch(10)
    assert batch is not None
    assert ids(batch.records) == ids([rec(4), rec(5)])
    assert reopened.append([rec(6)]) is SpoolStatus.OK
    reopened.ack(batch)
    last = reopened.read_batch(10)
    assert last is not None
    assert (ids(last.records), last.first_seq) == (ids([rec(6)]), 7)  # seq continues


def test_acknowledging_everything_empties_the_file_and_seq_continues_after_a_restart(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path))
    spool.append([rec(i) for i in range(3)])
    batch = spool.read_batch(10)
    assert batch is not None
    spool.ack(batch)
    assert os.path.getsize(tmp_path / SPOOL_FILE) == 0
    spool.close()
    reopened = UsageSpool(str(tmp_path))
    assert reopened.read_batch(10) is None
    assert reopened.last_minute == rec(2)["minute"]  # remembered through the state file
    reopened.append([rec(9)])
    batch = reopened.read_batch(10)
    assert batch is not None
    assert batch.first_seq == 4


def test_a_large_acknowledged_prefix_is_compacted_away(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path), compact_min_bytes=1000)
    spool.append([rec(i) for i in range(40)])
    size_before = spool.size_bytes
    batch = spool.read_batch(30)
    assert batch is not None
    spool.ack(batch)
    assert spool.size_bytes < size_before / 3
    assert os.path.getsize(tmp_path / SPOOL_FILE) == spool.size_bytes
    rest = spool.read_batch(100)
    assert rest is not None
    assert ids(rest.records) == ids([rec(i) for i in range(30, 40)])
    assert rest.first_seq == 31
    spool.close()
    reopened = UsageSpool(str(tmp_path))
    again = reopened.read_batch(100)
    assert again is not None
    assert ids(again.records) == ids(rest.records)


def test_an_ack_of_a_batch_read_before_a_compaction_still_lands(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path), compact_min_bytes=100, max_bytes=4000)
    spool.append([rec(i) for i in range(10)])
    first = spool.read_batch(5)
    assert first is not None
    spool.ack(first)  # compacts: the next batch's offsets are in a new file
    second = spool.read_batch(2)
    assert second is not None
    spool.append([rec(i) for i in range(10, 14)])
    spool.ack(second)
    rest = spool.read_batch(100)
    assert rest is not None
    assert ids(rest.records) == ids([rec(i) for i in range(7, 14)])


def test_a_full_spool_refuses_new_records_keeps_the_old_ones_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = UsageSpool(str(tmp_path), max_bytes=1000)
    n = 0
    while spool.append([rec(n)]) is SpoolStatus.OK:
        n += 1
    assert 0 < n < 10
    with caplog.at_level(logging.WARNING):
        assert spool.append([rec(99)]) is SpoolStatus.FULL
    assert "is full" in caplog.text
    assert spool.full_refusals == 2
    assert spool.pending == n
    assert os.path.getsize(tmp_path / SPOOL_FILE) <= 1000
    batch = spool.read_batch(100)
    assert batch is not None
    assert ids(batch.records) == ids([rec(i) for i in range(n)])
    spool.ack(batch)
    assert spool.append([rec(99)]) is SpoolStatus.OK  # room again


def test_a_torn_last_line_is_cut_and_a_corrupt_line_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = UsageSpool(str(tmp_path))
    spool.append([rec(1), rec(2)])
    spool.close()
    path = tmp_path / SPOOL_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"seq": 3, "rec\xff\n' + lines[1] + b'{"seq":4,"record":{"rep')
    with caplog.at_level(logging.WARNING):
        reopened = UsageSpool(str(tmp_path))
    assert "torn" in caplog.text
    assert reopened.corrupt_lines == 1
    assert path.read_bytes().endswith(b"\n")
    batch = reopened.read_batch(10)
    assert batch is not None
    assert ids(batch.records) == ids([rec(1), rec(2)])
    reopened.append([rec(3)])
    reopened.ack(batch)
    last = reopened.read_batch(10)
    assert last is not None
    assert ids(last.records) == ids([rec(3)])


def test_a_failed_append_is_cut_back_and_the_spool_stays_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = UsageSpool(str(tmp_path))
    spool.append([rec(1)])
    real = usage_spool._write_all

    def half_then_fail(fd: int, data: bytes) -> None:
        real(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(usage_spool, "_write_all", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        spool.append([rec(2), rec(3)])
    monkeypatch.undo()
    spool.append([rec(4)])
    spool.close()
    reopened = UsageSpool(str(tmp_path))
    assert reopened.corrupt_lines == 0
    batch = reopened.read_batch(10)
    assert batch is not None
    assert ids(batch.records) == ids([rec(1), rec(4)])
    assert (batch.first_seq, batch.last_seq) == (1, 2)


def test_a_crash_between_the_state_write_and_the_compaction_sends_nothing_twice(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path), compact_min_bytes=1 << 30)
    spool.append([rec(i) for i in range(4)])
    spool.close()
    # What the ack leaves behind when the process dies right after saving the state file.
    (tmp_path / STATE_FILE).write_bytes(orjson.dumps({"acked_seq": 3, "last_minute": rec(3)["minute"]}))
    (tmp_path / (SPOOL_FILE + ".tmp")).write_bytes(b"half a compaction")
    reopened = UsageSpool(str(tmp_path))
    assert not (tmp_path / (SPOOL_FILE + ".tmp")).exists()
    batch = reopened.read_batch(10)
    assert batch is not None
    assert ids(batch.records) == ids([rec(3)])


def test_random_appends_acks_and_restarts_deliver_every_record_exactly_once(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    max_bytes, compact_min_bytes = rng.choice([2_000, 5_000, 1 << 20]), rng.choice([0, 500, 1 << 30])
    spool = UsageSpool(str(tmp_path), max_bytes=max_bytes, compact_min_bytes=compact_min_bytes)
    written: list[str] = []
    delivered: list[str] = []
    n = 0
    for _ in range(600):
        op = rng.random()
        if op < 0.4:
            batch_records = [rec(n + i, tenant=f"t{rng.randrange(3)}") for i in range(rng.randint(1, 4))]
            if spool.append(batch_records) is SpoolStatus.OK:
                written.extend(ids(batch_records))
            n += len(batch_records)
        elif op < 0.85:
            batch = spool.read_batch(rng.randint(1, 6))
            if batch is not None and rng.random() < 0.8:  # sometimes the control plane is down
                spool.ack(batch)
                delivered.extend(ids(batch.records))
        else:
            spool.close()
            spool = UsageSpool(str(tmp_path), max_bytes=max_bytes, compact_min_bytes=compact_min_bytes)
        assert spool.pending == len(written) - len(delivered)
    while (batch := spool.read_batch(7)) is not None:
        spool.ack(batch)
        delivered.extend(ids(batch.records))
    assert delivered == written
    assert spool.size_bytes == 0
