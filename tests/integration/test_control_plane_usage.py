"""Usage: brokers report records, a resent report is not counted twice, and tenants read their
usage per minute or hour — never another tenant's."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_plane.tenancy.metering import UsageMeter
from data_plane.tenancy.usage_reporter import UsageReporter
from data_plane.tenancy.usage_spool import UsageSpool
from tests.integration.helpers import until
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def record(
    report_id: str, minute: str | int, *, broker: str = "broker-a", tenant: str = "acme", **values: int
) -> dict[str, object]:
    base = {"requests_4k": 10, "bytes_in": 1000, "bytes_out": 2000, "stored_bytes": 5000}
    base.update(values)
    return {"report_id": report_id, "broker": broker, "tenant": tenant, "minute": minute, **base}


async def broker_token(cp: ControlPlaneHarness) -> str:
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    return await cp.token_for(made.body["access_key"], made.body["secret"])


async def test_usage_is_ingested_once_per_report_id_and_aggregated(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, acme = await cp.new_tenant("acme")
    _, beta = await cp.new_tenant("beta")
    broker = await broker_token(cp)
    batch = [
        record("a-1", "2026-05-01T10:00:00Z"),
        record("a-2", "2026-05-01T10:00:30Z", stored_bytes=6000),  # same minute: counters add, storage peaks
        record("b-1", "2026-05-01T10:00:00Z", broker="broker-b", stored_bytes=1000, forced_deleted_messages=5),
        record("a-3", "2026-05-01T10:59:00Z", stored_bytes=9000, forced_deleted_messages=7),
        record("a-4", "2026-05-01T11:05:00Z"),
        record("x-1", "2026-05-01T10:00:00Z", tenant="beta", requests_4k=999),
    ]
    first = await cp.call("POST", "/internal/v1/usage", token=broker, json={"records": batch})
    assert first.status == 200
    assert first.body == {"accepted": 6, "duplicates": 0}
    resent = await cp.call(
        "POST", "/internal/v1/usage", token=broker, json={"records": [*batch, record("a-5", "2026-05-01T11:06:00Z")]}
    )
    assert resent.body == {"accepted": 1, "duplicates": 6}

    q = "from=2026-05-01T10:00:00Z&to=2026-05-01T12:00:00Z"
    minutes = await cp.call("GET", f"/v1/tenants/acme/usage?{q}&granularity=minute", token=acme)
    assert minutes.status == 200
    rows = {b["start"]: b for b in minutes.body["buckets"]}
    ten = rows["2026-05-01T10:00:00+00:00"]
    assert (ten["requests_4k"], ten["bytes_in"], ten["stored_bytes"], ten["forced_deleted_messages"]) == (
        30,
        3000,
        7000,
        5,
    )  # a: max(5000, 6000) + b: 1000; a record without forced_deleted_messages counts 0
    assert len(rows) == 4
    hours = await cp.call("GET", f"/v1/tenants/acme/usage?{q}&granularity=hour", token=acme)
    buckets = hours.body["buckets"]
    assert [b["start"] for b in buckets] == ["2026-05-01T10:00:00+00:00", "2026-05-01T11:00:00+00:00"]
    assert (buckets[0]["requests_4k"], buckets[0]["bytes_out"], buckets[0]["stored_bytes"]) == (40, 8000, 9000)
    assert (buckets[1]["requests_4k"], buckets[1]["stored_bytes"]) == (20, 5000)
    assert hours.body["totals"] == {
        "requests_4k": 60,
        "bytes_in": 6000,
        "bytes_out": 12000,
        "forced_deleted_messages": 12,
        "stored_bytes_max": 9000,
        "tiered_bytes_max": 0,  # no broker here keeps anything in object storage
        "messages_in": 0,  # records without the message counters count 0
        "messages_out": 0,
        "throttled_requests": 0,
    }
    beta_usage = await cp.call("GET", f"/v1/tenants/beta/usage?{q}", token=beta)
    assert beta_usage.body["totals"]["requests_4k"] == 999
    assert (await cp.call("GET", f"/v1/tenants/beta/usage?{q}", token=acme)).status == 403
    assert (await cp.call("GET", f"/v1/tenants/acme/usage?{q}", operator=True)).status == 200


async def test_only_brokers_report_and_bad_records_are_refused(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, acme = await cp.new_tenant("acme")
    broker = await broker_token(cp)
    batch = {"records": [record("r-1", "2026-05-01T10:00:00Z")]}
    assert (await cp.call("POST", "/internal/v1/usage", token=acme, json=batch)).status == 403
    bad = await cp.call("POST", "/internal/v1/usage", token=broker, json={"records": [record("r-1", "yesterday")]})
    assert bad.status == 400
    assert "minute" in bad.body["error"]["message"]
    for field, value in [
        ("bytes_in", -1),
        ("tiered_bytes", -1),
        *((f, v) for f in ("messages_in", "messages_out", "throttled_requests") for v in (-1, "12", 1.5, True)),
    ]:
        refused = await cp.call(
            "POST",
            "/internal/v1/usage",
            token=broker,
            json={"records": [{**record("r-1", "2026-05-01T10:00:00Z"), field: value}]},
        )
        assert refused.status == 400, (field, value, refused.body)
        assert field in refused.body["error"]["details"]["field"]
    epoch_ms = await cp.call(
        "POST", "/internal/v1/usage", token=broker, json={"records": [record("r-2", 1_777_629_600_000)]}
    )
    assert epoch_ms.status == 200
    assert epoch_ms.body["accepted"] == 1
    assert await cp.services.pool.fetchval("SELECT count(*) FROM usage_records") == 1
    wide = await cp.call(
        "GET", "/v1/tenants/acme/usage?from=2026-01-01T00:00:00Z&to=2026-05-01T00:00:00Z&granularity=minute", token=acme
    )
    assert wide.status == 400
    assert wide.body["error"]["details"]["field"] == "to"


async def test_tiered_bytes_is_a_gauge_beside_stored_bytes(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, acme = await cp.new_tenant("acme")
    broker = await broker_token(cp)
    batch = [
        record("a-1", "2026-05-01T10:00:00Z", stored_bytes=100, tiered_bytes=7000),
        record("a-2", "2026-05-01T10:00:30Z", stored_bytes=90, tiered_bytes=7100),  # a broker's minute: its largest
        record("b-1", "2026-05-01T10:00:00Z", broker="broker-b", stored_bytes=10, tiered_bytes=500),
        record("a-3", "2026-05-01T10:30:00Z", stored_bytes=200),  # a broker without a tier sends none: 0
        record("a-4", "2026-05-01T11:00:00Z", stored_bytes=50, tiered_bytes=9000),
    ]
    assert (await cp.call("POST", "/internal/v1/usage", token=broker, json={"records": batch})).status == 200
    q = "from=2026-05-01T10:00:00Z&to=2026-05-01T12:00:00Z"
    minutes = await cp.call("GET", f"/v1/tenants/acme/usage?{q}&granularity=minute", token=acme)
    rows = {b["start"][11:16]: (b["stored_bytes"], b["tiered_bytes"]) for b in minutes.body["buckets"]}
    assert rows == {"10:00": (110, 7600), "10:30": (200, 0), "11:00": (50, 9000)}  # brokers add up
    hours = await cp.call("GET", f"/v1/tenants/acme/usage?{q}&granularity=hour", token=acme)
    assert [(b["stored_bytes"], b["tiered_bytes"]) for b in hours.body["buckets"]] == [(200, 7600), (50, 9000)]
    totals = hours.body["totals"]
    assert (totals["stored_bytes_max"], totals["tiered_bytes_max"]) == (200, 9000)
    assert "tiered_bytes" not in totals  # a gauge does not add up over time


async def test_a_brokers_meter_spool_and_reporter_bring_tiered_bytes_to_the_usage_api(
    control_plane: ControlPlaneHarness, tmp_path: Path
) -> None:
    """The broker's side as it runs (UsageMeter → UsageSpool → UsageReporter) against the real
    control plane: the gauges the broker measured reach the tenant's usage."""
    cp = control_plane
    _, acme = await cp.new_tenant("acme")
    _, beta = await cp.new_tenant("beta")
    broker = await broker_token(cp)
    spool = UsageSpool(str(tmp_path / "usage"))
    minute = 1_777_629_600_000  # 2026-05-01T10:00:00Z
    meter = UsageMeter("broker-a", spool=spool, clock_ms=lambda: minute)
    meter.replace_stored_bytes({"acme": 4096, "beta": 10}, {"acme": 1 << 30})
    meter.record_request("beta", 100, 0)
    assert await meter.roll_and_spool(minute + 60_000) == 2
    reporter = UsageReporter(spool, control_plane_url=cp.url, token=lambda: broker, idle_interval_s=0.01)
    reporter.start()
    try:
        await until(lambda: spool.pending == 0, "the spool delivered", timeout_s=10)
    finally:
        await reporter.stop()
    q = "from=2026-05-01T10:00:00Z&to=2026-05-01T11:00:00Z&granularity=minute"
    got = (await cp.call("GET", f"/v1/tenants/acme/usage?{q}", token=acme)).body["totals"]
    assert (got["stored_bytes_max"], got["tiered_bytes_max"]) == (4096, 1 << 30)
    got = (await cp.call("GET", f"/v1/tenants/beta/usage?{q}", token=beta)).body["totals"]
    assert (got["stored_bytes_max"], got["tiered_bytes_max"], got["bytes_in"]) == (10, 0, 100)


async def test_message_counts_and_throttled_requests_add_up_per_minute_and_hour(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    _, acme = await cp.new_tenant("acme")
    _, beta = await cp.new_tenant("beta")
    broker = await broker_token(cp)
    batch = [
        record("a-1", "2026-05-01T10:00:00Z", messages_in=10, messages_out=4, throttled_requests=2),
        record("a-2", "2026-05-01T10:00:30Z", messages_in=5, throttled_requests=1),  # a broker's minute adds up
        record("b-1", "2026-05-01T10:00:00Z", broker="broker-b", messages_in=1, messages_out=20),  # so do brokers
        record("a-3", "2026-05-01T10:30:00Z"),  # a broker that counted none of them sends none: 0
        record("a-4", "2026-05-01T11:00:00Z", messages_in=7, messages_out=7, throttled_requests=30),
        record("x-1", "2026-05-01T10:00:00Z", tenant="beta", messages_in=1000, throttled_requests=1000),
    ]
    reply = await cp.call("POST", "/internal/v1/usage", token=broker, json={"records": batch})
    assert reply.status == 200
    assert reply.body == {"accepted": 6, "duplicates": 0}
    again = await cp.call("POST", "/internal/v1/usage", token=broker, json={"records": batch[:1]})
    assert again.body == {"accepted": 0, "duplicates": 1}  # a resent record is not counted again

    def counts(bucket: dict[str, int]) -> tuple[int, int, int]:
        return bucket["messages_in"], bucket["messages_out"], bucket["throttled_requests"]

    q = "from=2026-05-01T10:00:00Z&to=2026-05-01T12:00:00Z"
    minutes = await cp.call("GET", f"/v1/tenants/acme/usage?{q}&granularity=minute", token=acme)
    assert {b["start"][11:16]: counts(b) for b in minutes.body["buckets"]} == {
        "10:00": (16, 24, 3),
        "10:30": (0, 0, 0),
        "11:00": (7, 7, 30),
    }
    assert counts(minutes.body["totals"]) == (23, 31, 33)
    hours = await cp.call("GET", f"/v1/tenants/acme/usage?{q}&granularity=hour", token=acme)
    assert [counts(b) for b in hours.body["buckets"]] == [(16, 24, 3), (7, 7, 30)]
    assert counts(hours.body["totals"]) == (23, 31, 33)
    beta_usage = await cp.call("GET", f"/v1/tenants/beta/usage?{q}", token=beta)
    assert counts(beta_usage.body["totals"]) == (1000, 0, 1000)
