"""Messages deleted inside retention at the disk's emergency watermark, per tenant: the broker's
ledger (data_plane/broker/forced_deletions.py), its usage-record field (metering.py) and its
OpenTelemetry counter (telemetry.py)."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from data_plane.broker.forced_deletions import SYSTEM, ForcedDeletions
from data_plane.store.retention import ForcedDeletion
from data_plane.telemetry import register_forced_deletions, setup_telemetry
from data_plane.tenancy.metering import MINUTE_MS, UsageMeter
from tests.conftest import counter_points

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS


def test_each_deletion_is_counted_and_logged_per_tenant(caplog: pytest.LogCaptureFixture) -> None:
    reported: list[tuple[str, int]] = []
    ledger = ForcedDeletions(report=lambda t, n: reported.append((t, n)))
    caplog.set_level(logging.WARNING, logger="data_plane.broker.forced_deletions")
    per_topic = {"acme%orders": 10, "acme%audit": 2, "%RETRY%acme%billing": 1, "globex%events": 5, "SCHEDULE_TOPIC": 3}
    ledger(ForcedDeletion("00000000000000000000", 0, 1_700_000_000_000, 0.961, per_topic))
    ledger(ForcedDeletion("00000000000000065536", 65536, None, 0.955, {"acme%orders": 4}))
    assert ledger.files == 2
    assert ledger.messages == {"acme": 17, "globex": 5, SYSTEM: 3}
    assert reported == [("acme", 13), ("globex", 5), ("acme", 4)]  # the system share is not a tenant's
    assert ledger.runtime_info() == {
        "forcedDeletionFiles": 2,
        "forcedDeletionMessages": 25,
        f"forcedDeletionMessages.{SYSTEM}": 3,
        "forcedDeletionMessages.acme": 17,
        "forcedDeletionMessages.globex": 5,
    }
    lines = [r.getMessage() for r in caplog.records]
    assert any("tenant acme lost 13 messages inside their retention" in m and "96.1% disk use" in m for m in lines)
    assert any("tenant globex lost 5 messages" in m for m in lines)
    assert any("tenant acme lost 4 messages inside their retention (17 so far)" in m for m in lines)


def test_a_file_with_no_queued_message_inside_retention_is_still_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = ForcedDeletions()
    caplog.set_level(logging.WARNING, logger="data_plane.broker.forced_deletions")
    ledger(ForcedDeletion("00000000000000000000", 0, None, 0.99, {}))
    assert ledger.runtime_info() == {"forcedDeletionFiles": 1, "forcedDeletionMessages": 0}
    assert "no queued message inside its retention" in caplog.text


def test_the_usage_record_carries_forced_deletions_only_when_there_were_some() -> None:
    meter = UsageMeter("broker-a", clock_ms=lambda: T0 + 5_000)
    meter.record_request("acme", 100, 0)
    meter.record_request("globex", 100, 0)
    meter.record_forced_deletion("acme", 7)
    meter.record_forced_deletion("acme", 3)
    meter.record_forced_deletion("initech", 2)  # no traffic: a record all the same
    records = {r["tenant"]: r for r in meter.roll(T0 + MINUTE_MS)}
    assert records["acme"].get("forced_deleted_messages") == 10
    assert "forced_deleted_messages" not in records["globex"]
    assert records["initech"]["forced_deleted_messages"] == 2
    assert records["initech"]["requests_4k"] == 0
    # Records the spool refused come back into the open minute, forced deletions included.
    meter.fold_back(records.values())
    again = {r["tenant"]: r for r in meter.roll(T0 + 2 * MINUTE_MS)}
    assert again["acme"].get("forced_deleted_messages") == 10
    assert "forced_deleted_messages" not in again["globex"]


def test_the_metric_reads_the_ledger_at_collection() -> None:
    reader = InMemoryMetricReader()
    t = setup_telemetry("orbit-broker-test", exporter="none", metric_readers=[reader], set_global=False)
    ledger = ForcedDeletions()
    register_forced_deletions(t, ledger.messages, broker_name="broker-a")

    def points() -> dict[str, int]:
        return counter_points(reader, "orbit.store.forced_deletion.messages", "messaging.rocketmq.namespace")

    assert points() == {}
    ledger(ForcedDeletion("f0", 0, None, 0.96, {"acme%orders": 10, "globex%events": 1}))
    ledger(ForcedDeletion("f1", 65536, None, 0.96, {"acme%orders": 5}))
    assert points() == {"acme": 15, "globex": 1}
    t.shutdown()
