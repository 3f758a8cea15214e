"""data_plane/tenancy/quota.py: token buckets per tenant, the retry-after contract, bounded state;
data_plane/tenancy/namespace.py: which tenant a wire resource belongs to."""

from __future__ import annotations

import random

import pytest

from data_plane.remoting.codes import ResponseCode
from data_plane.tenancy.namespace import tenant_of
from data_plane.tenancy.quota import (
    BLOCKED_RETRY_AFTER_MS,
    FLOW_CONTROL,
    REMARK_PREFIX,
    Limits,
    QuotaManager,
    flow_control_remark,
    parse_retry_after_ms,
)

pytestmark = pytest.mark.unit


class Clock:
    """An injected monotonic ``clock_s``, moved by the test."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000.0


def manager(clock: Clock, **kw: object) -> QuotaManager:
    return QuotaManager(clock_s=clock, **kw)  # type: ignore[arg-type]


# --- unknown tenants and defaults ----------------------------------------------------------------
def test_a_tenant_without_limits_is_never_refused_and_keeps_no_state() -> None:
    clock = Clock()
    q = manager(clock)
    for _ in range(10_000):
        assert q.acquire_publish("acme", 100, 1 << 20) == 0
        assert q.acquire_consume("acme", 100, 1 << 20) == 0
        q.charge_consume("acme", 100, 1 << 20)
    assert len(q) == 0
    assert q.limits_of("acme") is None


def test_the_default_limits_apply_to_tenants_without_their_own() -> None:
    clock = Clock()
    q = manager(clock, default_limits=Limits(publish_msgs_per_s=10))
    q.set_limits("big", Limits(publish_msgs_per_s=1000))
    assert [q.acquire_publish("small", 1, 0) for _ in range(11)][-1] > 0
    assert all(q.acquire_publish("big", 1, 0) == 0 for _ in range(1000))
    q.set_limits("big", None)  # back to the default
    assert q.limits_of("big") == Limits(publish_msgs_per_s=10)


# --- the buckets ---------------------------------------------------------------------------------
def test_a_burst_of_one_second_passes_then_the_rate_holds_with_an_exact_retry_after() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=100))
    assert all(q.acquire_publish("acme", 1, 10) == 0 for _ in range(100))  # the burst
    wait = q.acquire_publish("acme", 1, 10)
    assert wait == 11  # one token at 100/s: 10 ms, rounded up to floor(10) + 1
    clock.advance_ms(9)
    assert q.acquire_publish("acme", 1, 10) > 0
    clock.advance_ms(wait - 9)
    assert q.acquire_publish("acme", 1, 10) == 0


def test_a_refused_request_takes_nothing_from_either_bucket() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=100, publish_bytes_per_s=1000))
    assert q.acquire_publish("acme", 1, 900) == 0
    before = q.tokens("acme")
    assert before is not None
    wait = q.acquire_publish("acme", 1, 500)  # msgs would pass, bytes do not
    assert wait == 401  # 400 bytes missing at 1000 B/s
    assert q.tokens("acme") == before
    assert before["publish_msgs"] == 99


def test_the_retry_after_is_the_wait_of_the_slowest_bucket() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=10, publish_bytes_per_s=1000))
    assert q.acquire_publish("acme", 10, 1000) == 0
    assert q.acquire_publish("acme", 1, 100) == 101  # msgs: 100 ms, bytes: 100 ms
    assert q.acquire_publish("acme", 5, 100) == 501  # msgs: 500 ms
    assert q.acquire_publish("acme", 1, 800) == 801  # bytes: 800 ms


def test_burst_seconds_are_configurable_per_manager_and_per_tenant() -> None:
    clock = Clock()
    q = manager(clock, burst_s=2.0)
    q.set_limits("a", Limits(publish_msgs_per_s=10))
    q.set_limits("b", Limits(publish_msgs_per_s=10, burst_s=0.5))
    assert sum(q.acquire_publish("a", 1, 0) == 0 for _ in range(100)) == 20
    assert sum(q.acquire_publish("b", 1, 0) == 0 for _ in range(100)) == 5


def test_a_request_larger_than_a_whole_burst_passes_when_full_and_leaves_a_debt() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_bytes_per_s=1 << 20))
    assert q.acquire_publish("acme", 1, 4 << 20) == 0  # 4 MiB against a 1 MiB burst
    tokens = q.tokens("acme")
    assert tokens is not None
    assert tokens["publish_bytes"] == -(3 << 20)
    assert q.acquire_publish("acme", 1, 1) == 3001  # the debt first: 3 s
    clock.advance_ms(3001)
    assert q.acquire_publish("acme", 1, 1) == 0
    assert q.acquire_publish("acme", 1, 4 << 20) > 0  # not full again yet: refused
    clock.advance_ms(1000)
    assert q.acquire_publish("acme", 1, 4 << 20) == 0


def test_consumption_charged_after_the_fact_makes_the_next_pulls_wait() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(consume_msgs_per_s=100, consume_bytes_per_s=10_000))
    assert q.acquire_consume("acme", 0, 0) == 0
    q.charge_consume("acme", 32, 30_000)  # the pull returned three seconds' worth of bytes
    wait = q.acquire_consume("acme", 0, 0)
    assert wait == 2001  # 20,000 bytes of debt at 10,000 B/s
    clock.advance_ms(wait)
    assert q.acquire_consume("acme", 0, 0) == 0
    assert q.acquire_publish("acme", 1000, 1 << 30) == 0  # publishing is a separate budget


def test_acquire_consume_with_a_size_behaves_like_publish() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(consume_msgs_per_s=4))
    assert [q.acquire_consume("acme", 1, 0) for _ in range(5)] == [0, 0, 0, 0, 251]


def test_a_rate_of_zero_refuses_everything_and_none_is_unlimited() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=0, consume_msgs_per_s=None, consume_bytes_per_s=100))
    assert q.acquire_publish("acme", 0, 0) == BLOCKED_RETRY_AFTER_MS
    assert q.acquire_publish("acme", 1, 0) == BLOCKED_RETRY_AFTER_MS
    clock.advance_ms(3_600_000)
    assert q.acquire_publish("acme", 1, 0) == BLOCKED_RETRY_AFTER_MS
    assert all(q.acquire_consume("acme", 10_000, 0) == 0 for _ in range(100))
    assert q.acquire_consume("acme", 1, 60) == 0  # the bytes bucket (100 B) is the only limit
    assert q.acquire_consume("acme", 1, 60) == 201


def test_the_clock_going_nowhere_or_back_mints_no_tokens() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=10))
    assert sum(q.acquire_publish("acme", 1, 0) == 0 for _ in range(20)) == 10
    clock.advance_ms(-5000)
    assert q.acquire_publish("acme", 1, 0) > 0
    clock.advance_ms(5000)  # back where it was: still nothing new
    assert q.acquire_publish("acme", 1, 0) > 0


def test_the_long_run_rate_never_exceeds_rate_times_time_plus_one_burst(seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    q = manager(clock)
    rate_msgs, rate_bytes = rng.choice([5, 50, 500]), rng.choice([1_000, 100_000])
    q.set_limits("acme", Limits(publish_msgs_per_s=rate_msgs, publish_bytes_per_s=rate_bytes))
    granted_msgs = granted_bytes = 0
    start = clock.now
    for _ in range(20_000):
        clock.advance_ms(rng.expovariate(1 / 5))
        msgs, nbytes = rng.randint(1, 8), rng.randint(0, 2_000)
        wait = q.acquire_publish("acme", msgs, nbytes)
        if wait == 0:
            granted_msgs += msgs
            granted_bytes += nbytes
        else:
            assert wait > 0
    elapsed = clock.now - start
    # One request may overdraw a bucket (the min(cost, capacity) rule): at most one request's cost.
    assert granted_msgs <= rate_msgs * (elapsed + 1) + 8
    assert granted_bytes <= rate_bytes * (elapsed + 1) + 2_000
    # ... and demand exceeds both rates here, so the binding bucket is used to the full.
    assert max(granted_msgs / (rate_msgs * elapsed), granted_bytes / (rate_bytes * elapsed)) >= 0.8


# --- limits pushed by the control plane ----------------------------------------------------------
def test_new_limits_keep_what_the_bucket_holds_clamped_to_the_new_burst() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=100))
    for _ in range(40):
        q.acquire_publish("acme", 1, 0)
    q.set_limits("acme", Limits(publish_msgs_per_s=1000))  # 60 left, new burst 1000: 60 stay
    tokens = q.tokens("acme")
    assert tokens is not None
    assert tokens["publish_msgs"] == 60
    q.set_limits("acme", Limits(publish_msgs_per_s=10))  # clamped to 10
    tokens = q.tokens("acme")
    assert tokens is not None
    assert tokens["publish_msgs"] == 10


def test_a_bucket_that_was_unlimited_or_blocked_starts_full() -> None:
    clock = Clock()
    q = manager(clock)
    q.set_limits("acme", Limits(publish_msgs_per_s=0))
    assert q.acquire_publish("acme", 1, 0) == BLOCKED_RETRY_AFTER_MS
    q.set_limits("acme", Limits(publish_msgs_per_s=5))
    assert [q.acquire_publish("acme", 1, 0) for _ in range(6)][:5] == [0] * 5


def test_a_snapshot_replaces_every_limit_and_tenants_left_out_fall_back() -> None:
    clock = Clock()
    q = manager(clock, default_limits=Limits(publish_msgs_per_s=1))
    q.replace_limits({"a": Limits(publish_msgs_per_s=100), "b": Limits(publish_msgs_per_s=100)})
    for t in ("a", "b"):
        assert q.acquire_publish(t, 50, 0) == 0
    q.replace_limits({"a": Limits(publish_msgs_per_s=100)})
    assert q.limits_of("b") == Limits(publish_msgs_per_s=1)
    assert q.acquire_publish("b", 1, 0) == 0  # clamped to the default's burst of 1
    assert q.acquire_publish("b", 1, 0) > 0
    q.set_default_limits(None)
    assert q.acquire_publish("b", 1000, 0) == 0
    assert q.tokens("b") is None  # unlimited: its state is gone
    assert q.acquire_publish("a", 50, 0) == 0


def test_limits_are_validated_and_read_from_the_control_planes_json() -> None:
    doc = {"publish_msgs_per_s": 1000, "publish_bytes_per_s": 1048576.5, "consume_msgs_per_s": None}
    assert Limits.from_dict(doc) == Limits(publish_msgs_per_s=1000, publish_bytes_per_s=1048576.5)
    round_trip = Limits(consume_bytes_per_s=5, burst_s=2)
    assert Limits.from_dict(round_trip.to_dict()) == round_trip
    with pytest.raises(ValueError, match="unknown"):
        Limits.from_dict({"publish_per_s": 1})
    with pytest.raises(ValueError, match="number"):
        Limits.from_dict({"publish_msgs_per_s": "10"})
    with pytest.raises(ValueError, match="number"):
        Limits.from_dict({"publish_msgs_per_s": True})
    with pytest.raises(ValueError, match=">= 0"):
        Limits(publish_msgs_per_s=-1)
    with pytest.raises(ValueError, match=">= 0"):
        Limits(consume_bytes_per_s=float("inf"))
    with pytest.raises(ValueError, match="burst_s"):
        Limits(burst_s=0)


# --- bounded memory ------------------------------------------------------------------------------
def test_idle_tenants_with_full_buckets_are_dropped_and_tenants_in_debt_are_kept() -> None:
    clock = Clock()
    q = manager(clock, default_limits=Limits(consume_bytes_per_s=100), idle_evict_s=60)
    for i in range(1000):
        q.acquire_consume(f"t{i}", 0, 0)
    q.charge_consume("debtor", 1, 100_000)  # 1000 s of debt
    assert len(q) == 1001
    clock.advance_ms(61_000)
    assert q.sweep() == 1000
    assert len(q) == 1
    assert q.acquire_consume("debtor", 0, 0) > 0


def test_the_hot_path_sweeps_by_itself() -> None:
    clock = Clock()
    q = manager(clock, default_limits=Limits(publish_msgs_per_s=10), idle_evict_s=30)
    for i in range(100):
        q.acquire_publish(f"t{i}", 1, 0)
    clock.advance_ms(31_000)
    q.acquire_publish("t0", 1, 0)
    assert len(q) == 1


def test_past_max_tenants_full_buckets_go_at_once() -> None:
    clock = Clock()
    q = manager(clock, default_limits=Limits(publish_msgs_per_s=10), max_tenants=100)
    for i in range(100):
        q.acquire_publish(f"t{i}", 1, 0)
    clock.advance_ms(1000)  # everyone refilled
    q.acquire_publish("new", 1, 0)
    assert len(q) == 1


def test_eviction_never_changes_a_decision(seed: int) -> None:
    """Two managers see the same requests: one evicts as eagerly as it can, one never does."""
    rng = random.Random(seed)
    c1, c2 = Clock(), Clock()
    limits = Limits(publish_msgs_per_s=20, publish_bytes_per_s=5_000, consume_msgs_per_s=50, consume_bytes_per_s=9_000)
    eager = manager(c1, default_limits=limits, idle_evict_s=0.001, max_tenants=3)
    never = manager(c2, default_limits=limits, idle_evict_s=1e9, max_tenants=10**9)
    tenants = [f"t{i}" for i in range(12)]
    for step in range(30_000):
        dt = rng.expovariate(1 / 20)
        c1.advance_ms(dt)
        c2.advance_ms(dt)
        t, msgs, nbytes = rng.choice(tenants), rng.randint(0, 5), rng.randint(0, 3_000)
        op = rng.random()
        if op < 0.5:
            assert eager.acquire_publish(t, msgs, nbytes) == never.acquire_publish(t, msgs, nbytes), step
        elif op < 0.8:
            assert eager.acquire_consume(t, msgs, nbytes) == never.acquire_consume(t, msgs, nbytes), step
        else:
            eager.charge_consume(t, msgs, nbytes)
            never.charge_consume(t, msgs, nbytes)
        if step % 97 == 0:
            eager.sweep()
    c1.advance_ms(3_600_000)  # every debt paid: the eager one keeps nothing, the other everything
    eager.sweep()
    assert len(eager) == 0
    assert len(never) == len(tenants)


# --- the flow-control answer ---------------------------------------------------------------------
def test_the_remark_carries_the_retry_after_and_parses_back() -> None:
    assert FLOW_CONTROL is ResponseCode.FLOW_CONTROL
    assert int(FLOW_CONTROL) == 215
    remark = flow_control_remark("acme", "publish", 250)
    assert remark.startswith(REMARK_PREFIX)
    assert "retry-after-ms=250" in remark
    assert "'acme'" in remark
    assert "publish" in remark
    assert parse_retry_after_ms(remark) == 250
    assert parse_retry_after_ms(flow_control_remark("a", "consume", 1)) == 1
    assert parse_retry_after_ms("[TOO_MANY_REQUESTS] slow down") is None
    assert parse_retry_after_ms("") is None
    assert parse_retry_after_ms(None) is None


def test_the_sdks_flow_control_error_reads_the_brokers_remark() -> None:
    from sdk.errors import FlowControlError

    err = FlowControlError(remark=flow_control_remark("acme", "consume", 1234))
    assert err.retry_after_ms == 1234


# --- namespaces ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("resource", "tenant"),
    [
        ("acme%orders", "acme"),
        ("%RETRY%acme%billing", "acme"),
        ("%DLQ%acme%billing", "acme"),
        ("orders", None),
        ("%RETRY%billing", None),
        ("TBW102", None),
        ("%SYS%thing", None),
        ("acme%", None),
        ("%orders", None),
    ],
)
def test_the_tenant_of_a_resource_is_its_namespace(resource: str, tenant: str | None) -> None:
    assert tenant_of(resource) == tenant


# --- the frame path's early look and the remark's rate -------------------------------------------
def test_refuse_publish_refuses_as_acquire_would_and_takes_nothing_from_a_grant() -> None:
    clock = Clock()
    q = manager(clock, stagger_refusals=True)
    q.set_limits("t", Limits(publish_msgs_per_s=100))
    assert q.refuse_publish("t", 1, 10) == 0  # no state yet: not over its quota
    assert q.acquire_publish("t", 100, 1000) == 0  # the whole burst taken
    first = q.refuse_publish("t", 1, 10)
    assert first == 11  # 10 ms for one token at 100/s, rounded up
    # A refusal made early promises its slot as acquire_publish's would: the next one waits behind it.
    assert q.acquire_publish("t", 1, 10) == 21
    clock.advance_ms(50)
    tokens = q.tokens("t")
    assert tokens is not None
    held = tokens["publish_msgs"]
    assert q.refuse_publish("t", 1, 10) == 0  # five tokens back: it would be granted...
    tokens = q.tokens("t")
    assert tokens is not None
    assert tokens["publish_msgs"] == held


def test_the_remark_names_the_rate_a_client_paces_itself_to() -> None:
    from sdk.errors import FlowControlError

    def parse_quota_msgs_per_s(remark: str) -> float | None:  # as the client reads it
        return FlowControlError(remark=remark).quota_msgs_per_s

    remark = flow_control_remark("acme", "publish", 12, 1000.0)
    assert parse_retry_after_ms(remark) == 12
    assert parse_quota_msgs_per_s(remark) == 1000.0
    assert parse_quota_msgs_per_s(flow_control_remark("acme", "publish", 12, 2.5)) == 2.5
    assert parse_quota_msgs_per_s(flow_control_remark("acme", "publish", 12)) is None
    assert "e+" not in flow_control_remark("acme", "publish", 1, 5_000_000.0)
