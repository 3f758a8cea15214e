"""data_plane/tenancy/metering.py: counters per tenant, minutes rolled by the caller's wall clock,
records with stable report ids, and what happens when the spool refuses them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from data_plane.tenancy.metering import MINUTE_MS, UsageMeter, UsageRecord, minute_of, report_id, request_units
from data_plane.tenancy.usage_spool import SpoolStatus, UsageSpool

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS  # a minute boundary


class WallClock:
    def __init__(self, now_ms: int = T0 + 5_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def drain(spool: UsageSpool) -> list[UsageRecord]:
    out: list[UsageRecord] = []
    while (batch := spool.read_batch(100)) is not None:
        out.extend(batch.records)
        spool.ack(batch)
    return out


@pytest.mark.parametrize(
    ("nbytes", "units"), [(0, 1), (1, 1), (4095, 1), (4096, 1), (4097, 2), (8192, 2), (1 << 20, 256)]
)
def test_a_request_counts_in_4_kib_units_with_a_minimum_of_one(nbytes: int, units: int) -> None:
    assert request_units(nbytes) == units
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.record_request("acme", nbytes, 0)
    meter.record_request("acme", 0, nbytes)
    (rec,) = meter.roll(T0 + MINUTE_MS)
    assert rec["requests_4k"] == 2 * units


def test_a_request_moving_bytes_both_ways_counts_their_sum() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.record_request("acme", 3000, 3000)
    (rec,) = meter.roll(T0 + MINUTE_MS)
    assert (rec["requests_4k"], rec["bytes_in"], rec["bytes_out"]) == (2, 3000, 3000)


def test_a_finished_minute_becomes_one_record_per_tenant() -> None:
    clock = WallClock()
    meter = UsageMeter("broker-a", clock_ms=clock)
    assert meter.open_minute == T0
    meter.record_request("acme", 1000, 0)
    meter.record_request("acme", 5000, 0)
    meter.record_request("globex", 0, 9000)
    assert meter.roll(T0 + 59_999) == []  # still the same minute
    records = meter.roll(T0 + MINUTE_MS + 3)
    assert records == [
        {
            "report_id": f"broker-a:{T0}:acme",
            "broker": "broker-a",
            "tenant": "acme",
            "minute": T0,
            "requests_4k": 3,
            "bytes_in": 6000,
            "bytes_out": 0,
            "stored_bytes": 0,
        },
        {
            "report_id": f"broker-a:{T0}:globex",
            "broker": "broker-a",
            "tenant": "globex",
            "minute": T0,
            "requests_4k": 3,
            "bytes_in": 0,
            "bytes_out": 9000,
            "stored_bytes": 0,
        },
    ]
    assert meter.open_minute == T0 + MINUTE_MS
    assert meter.roll(T0 + 2 * MINUTE_MS) == []  # counters were reset, nothing happened since
    assert report_id("broker-a", T0, "acme") == records[0]["report_id"]


def test_stored_bytes_is_a_gauge_reported_every_minute() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.set_stored_bytes("acme", 10_000)
    meter.set_stored_bytes("globex", 5)
    for i in range(1, 4):
        records = meter.roll(T0 + i * MINUTE_MS)
        assert [(r["tenant"], r["stored_bytes"], r["requests_4k"]) for r in records] == [
            ("acme", 10_000, 0),
            ("globex", 5, 0),
        ]
    meter.set_stored_bytes("globex", 0)
    meter.replace_stored_bytes({"acme": 7, "initech": 0})
    assert [(r["tenant"], r["stored_bytes"]) for r in meter.roll(T0 + 4 * MINUTE_MS)] == [("acme", 7)]


def test_tiered_bytes_is_a_gauge_of_its_own_in_records_only_when_not_zero() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.replace_stored_bytes({"acme": 100, "globex": 5}, {"acme": 4000, "initech": 9})
    for i in range(1, 3):  # reported every minute, with or without traffic
        records = meter.roll(T0 + i * MINUTE_MS)
        assert [(r["tenant"], r["stored_bytes"], r.get("tiered_bytes")) for r in records] == [
            ("acme", 100, 4000),
            ("globex", 5, None),  # nothing tiered: no field (control planes before tiering refuse it)
            ("initech", 0, 9),  # all of it in object storage
        ]
    meter.replace_stored_bytes({"acme": 100})  # both gauges replaced: nothing tiered any more
    assert [(r["tenant"], r.get("tiered_bytes")) for r in meter.roll(T0 + 3 * MINUTE_MS)] == [("acme", None)]


def test_message_counts_and_throttled_requests_are_counters_in_records_only_when_not_zero() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.record_request("acme", 3000, 0)  # a send (its request) ...
    meter.record_stored("acme", 3)  # ... whose batch of 3 messages was stored
    meter.record_request("acme", 0, 500, 2)  # a pull that delivered 2 messages
    meter.record_request("acme", 0, 0)  # a pull that found nothing
    meter.record_throttled("acme")
    meter.record_throttled("acme")
    meter.record_throttled("initech")  # refused, nothing else
    meter.record_request("globex", 10, 0)  # traffic without messages: no new fields
    records = {r["tenant"]: r for r in meter.roll(T0 + MINUTE_MS)}
    acme = records["acme"]
    assert (acme["messages_in"], acme["messages_out"], acme["throttled_requests"]) == (3, 2, 2)
    assert (acme["requests_4k"], acme["bytes_in"], acme["bytes_out"]) == (3, 3000, 500)
    assert records["initech"] == {
        "report_id": f"b:{T0}:initech",
        "broker": "b",
        "tenant": "initech",
        "minute": T0,
        "requests_4k": 0,
        "bytes_in": 0,
        "bytes_out": 0,
        "stored_bytes": 0,
        "throttled_requests": 1,
    }
    assert not {"messages_in", "messages_out", "throttled_requests"} & records["globex"].keys()
    meter.record_stored("acme", 1)  # counters reset with each roll
    (again,) = meter.roll(T0 + 2 * MINUTE_MS)
    assert (again.get("messages_in"), again.get("messages_out"), again.get("throttled_requests")) == (1, None, None)


def test_fold_back_keeps_the_message_counts_and_throttled_requests() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.record_stored("acme", 5)
    meter.record_request("acme", 0, 100, 4)
    meter.record_throttled("acme")
    meter.record_forced_deletion("acme", 9)
    meter.fold_back(meter.roll(T0 + MINUTE_MS))  # the spool refused them
    meter.record_stored("acme", 1)
    (rec,) = meter.roll(T0 + 2 * MINUTE_MS)
    assert rec["minute"] == T0 + MINUTE_MS
    assert (rec["messages_in"], rec["messages_out"], rec["throttled_requests"], rec["forced_deleted_messages"]) == (
        6,
        4,
        1,
        9,
    )
    assert (rec["requests_4k"], rec["bytes_out"]) == (1, 100)


def test_a_late_roll_moves_traffic_into_the_open_minute_without_losing_any() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.record_request("acme", 100, 0)
    records = meter.roll(T0 + 3 * MINUTE_MS + 10)  # three minutes late: one record, nothing lost
    assert [(r["minute"], r["bytes_in"]) for r in records] == [(T0, 100)]
    assert meter.open_minute == T0 + 3 * MINUTE_MS


def test_a_wall_clock_stepping_back_never_reports_a_minute_twice() -> None:
    meter = UsageMeter("b", clock_ms=WallClock())
    meter.record_request("acme", 1, 0)
    assert meter.roll(T0 - 5 * MINUTE_MS) == []  # behind the open minute: keep counting
    meter.record_request("acme", 1, 0)
    (rec,) = meter.roll(T0 + MINUTE_MS)
    assert rec["bytes_in"] == 2


def test_after_a_restart_with_the_clock_behind_minutes_stay_unique(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path))
    first = UsageMeter("b", spool=spool, clock_ms=WallClock(T0 + 10 * MINUTE_MS))
    first.record_request("acme", 1, 0)
    assert spool.append(first.roll(T0 + 11 * MINUTE_MS)) is SpoolStatus.OK
    spool.close()

    spool = UsageSpool(str(tmp_path))
    assert spool.last_minute == T0 + 10 * MINUTE_MS
    again = UsageMeter("b", spool=spool, clock_ms=WallClock(T0 + 2 * MINUTE_MS))  # the clock went back
    again.record_request("acme", 2, 0)
    (rec,) = again.roll(T0 + 3 * MINUTE_MS)
    assert rec["minute"] == T0 + 11 * MINUTE_MS
    assert rec["report_id"] == f"b:{T0 + 11 * MINUTE_MS}:acme"
    again.record_request("acme", 3, 0)
    (rec,) = again.roll(T0 + 4 * MINUTE_MS)
    assert rec["minute"] == T0 + 12 * MINUTE_MS


@pytest.mark.asyncio
async def test_roll_and_spool_writes_the_records_durably(tmp_path: Path) -> None:
    clock = WallClock()
    spool = UsageSpool(str(tmp_path))
    meter = UsageMeter("b", spool=spool, clock_ms=clock)
    meter.record_request("acme", 10, 20)
    assert await meter.roll_and_spool(T0 + 30_000) == 0  # same minute
    clock.now_ms = T0 + MINUTE_MS + 1000
    assert await meter.roll_and_spool() == 1
    spool.close()
    reopened = UsageSpool(str(tmp_path))
    assert [(r["tenant"], r["minute"], r["bytes_out"]) for r in drain(reopened)] == [("acme", T0, 20)]


@pytest.mark.asyncio
async def test_a_full_spool_folds_the_minute_into_the_next_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = UsageSpool(str(tmp_path), max_bytes=300)
    meter = UsageMeter("b", spool=spool, clock_ms=WallClock())
    for minute in range(1, 4):
        meter.record_request("acme", 1000 * minute, 0)
        meter.record_stored("acme", minute)
        meter.record_throttled("acme")
        with caplog.at_level(logging.WARNING):
            await meter.roll_and_spool(T0 + minute * MINUTE_MS)
    assert spool.full_refusals >= 1
    assert "full" in caplog.text
    assert "folded into minute" in caplog.text
    spooled = drain(spool)  # the control plane caught up: room again
    meter.record_request("acme", 4000, 0)
    assert await meter.roll_and_spool(T0 + 4 * MINUTE_MS) == 1
    spooled += drain(spool)
    assert sum(r["bytes_in"] for r in spooled) == 1000 + 2000 + 3000 + 4000  # delayed, not lost
    assert sum(r.get("messages_in", 0) for r in spooled) == 1 + 2 + 3
    assert sum(r.get("throttled_requests", 0) for r in spooled) == 3
    assert len({r["report_id"] for r in spooled}) == len(spooled)


@pytest.mark.asyncio
async def test_a_failing_disk_folds_back_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = UsageSpool(str(tmp_path))
    meter = UsageMeter("b", spool=spool, clock_ms=WallClock())

    def broken(records: object) -> SpoolStatus:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "append", broken)
    meter.record_request("acme", 100, 0)
    assert await meter.roll_and_spool(T0 + MINUTE_MS) == 0
    monkeypatch.undo()
    meter.record_request("acme", 1, 0)
    assert await meter.roll_and_spool(T0 + 2 * MINUTE_MS) == 1
    (rec,) = drain(spool)
    assert (rec["minute"], rec["bytes_in"], rec["requests_4k"]) == (T0 + MINUTE_MS, 101, 2)


@pytest.mark.asyncio
async def test_run_rolls_after_every_minute_boundary(tmp_path: Path) -> None:
    clock = WallClock(T0 + 15_000)
    spool = UsageSpool(str(tmp_path))
    meter = UsageMeter("b", spool=spool, clock_ms=clock)
    slept: list[float] = []
    told: list[int] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        clock.now_ms += int(s * 1000)
        meter.record_request("acme", 1, 0)
        if len(slept) > 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await meter.run(lag_ms=500, sleep=sleep, on_spooled=told.append)
    assert slept[0] == pytest.approx(45.5)
    assert slept[1:] == [pytest.approx(60.0)] * 3
    assert told == [1, 1, 1]
    assert [r["minute"] for r in drain(spool)] == [T0, T0 + MINUTE_MS, T0 + 2 * MINUTE_MS]
    assert minute_of(clock.now_ms) == T0 + 4 * MINUTE_MS  # the fourth sleep ended the run
