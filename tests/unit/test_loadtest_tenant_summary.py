"""loadtest/runner.py: a tenant case reports each tenant's publishing and, from its own
consumers only, its end-to-end latency."""

from __future__ import annotations

import dataclasses

import pytest

from loadtest.histogram import encode_hist, new_hist, record_us
from loadtest.runner import _case_result, _Timeline
from loadtest.scenario import Case, Tenants
from loadtest.workers import ConsumerJob, ProducerJob

pytestmark = pytest.mark.unit


def _hist(*values_us: float) -> str:
    h = new_hist()
    for v in values_us:
        record_us(h, v)
    return encode_hist(h)


def _producer(i: int, tenant: str) -> tuple[ProducerJob, dict[str, object]]:
    job = ProducerJob(
        index=i, tenant=tenant, spec={}, topics=["t"], message_bytes=(10, 10), batch=1, connections=1,
        in_flight=1, ordered=False, keys=1, segments=(), warmup_s=0.0, duration_s=10.0, seed=i,
    )  # fmt: skip
    result = {
        "tenant": tenant, "acked": 100, "acked_measured": 100, "errors": 0, "errors_by_kind": {}, "dropped": 0,
        "hist": _hist(1000), "lag_hist": _hist(1),
    }  # fmt: skip
    return job, result


def _consumer(i: int, tenant: str, e2e_us: float) -> tuple[ConsumerJob, dict[str, object]]:
    job = ConsumerJob(index=i, tenant=tenant, spec={}, groups=["g"], topics=["t"], ordered=False, warmup_s=0.0)
    result = {
        "tenant": tenant, "consumed": 100, "per_group": {"g": 100}, "started_wall_s": 0.0, "first_wall_s": 1.0,
        "last_wall_s": 2.0, "hist": _hist(*[e2e_us] * 100), "out_of_order": 0, "redelivered": 0,
    }  # fmt: skip
    return job, result


def test_each_tenant_gets_the_end_to_end_latency_of_its_own_consumers() -> None:
    case = dataclasses.replace(
        Case(name="c", producers=2, consumers=2),
        tenants=Tenants(count=2, publish_quota_msgs_per_s=10, noisy_rate_msgs_per_s=20),
    )
    prods = [_producer(0, "lt-t0"), _producer(1, "lt-t1")]
    cons = [_consumer(0, "lt-t0", 50_000), _consumer(1, "lt-t1", 2_000)]
    done = {("producer", j.index): r for j, r in prods} | {("consumer", j.index): r for j, r in cons}
    out = _case_result(case, [j for j, _ in prods], [j for j, _ in cons], done, _Timeline(), 0.0, None)
    t0, t1 = out["tenants"]["lt-t0"], out["tenants"]["lt-t1"]
    assert t0["noisy"]
    assert not t1["noisy"]
    assert t0["consume"]["consumed"] == t1["consume"]["consumed"] == 100
    assert t0["consume"]["e2e_latency_ms"]["p99"] == pytest.approx(50, rel=0.01)
    assert t1["consume"]["e2e_latency_ms"]["p99"] == pytest.approx(2, rel=0.01)
