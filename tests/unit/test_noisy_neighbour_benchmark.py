"""The noisy-neighbour benchmark's arithmetic: each case against its own repetition's baselines,
the worst quiet tenant counted, medians over repetitions, and the verdict on the flood cases."""

from __future__ import annotations

from typing import Any

from benchmarks.noisy_neighbour import case_figures, summarize


def _tenant(send_p99: float, e2e_p99: float, *, noisy: bool = False, errors: int = 0, rate: float = 500.0) -> Any:
    return {
        "noisy": noisy,
        "errors": errors,
        "msgs_per_s": rate,
        "client_cpu_s": 1.5,
        "dropped_behind_schedule": 0,
        "send_latency_ms": {"count": 100, "p99": send_p99},
        "consume": {"consumed": 100, "expected": 100, "e2e_latency_ms": {"count": 100, "p99": e2e_p99}},
    }


def _case(t1: tuple[float, float], t2: tuple[float, float], *, noisy_rate: float = 500.0, errors: int = 0) -> Any:
    return {
        "tenants": {
            "lt-t0": _tenant(3000.0, 3000.0, noisy=True, rate=noisy_rate),
            "lt-t1": _tenant(*t1, errors=errors),
            "lt-t2": _tenant(*t2),
        },
        "broker_cost": {"cpu_s": 8.0, "quota_early_refusals": 3.0, "quota_refusals": 0.0},
    }


def test_a_case_is_its_worst_quiet_tenant_against_the_same_repetitions_baseline() -> None:
    before, after = _case((0.8, 2.0), (2.0, 1.0)), _case((1.2, 2.0), (2.0, 3.0))  # each tenant's mean: 1, 2 / 2, 2
    got = case_figures(_case((1.5, 2.0), (2.2, 4.0), noisy_rate=970.0), [before, after], 1000.0)
    assert got["quiet_ratio"] == {"send": 1.5, "e2e": 2.0}  # t1's send, t2's end-to-end
    assert got["noisy_quota_share"] == 0.97
    assert got["quiet_errors"] == 0
    assert got["noisy_client_cpu_s"] == 1.5


def test_the_verdict_takes_the_median_repetition_and_needs_every_target() -> None:
    baseline = _case((1.0, 1.0), (1.0, 1.0))

    def rep(ratio: float, errors: int = 0) -> dict[str, Any]:
        case = _case((ratio, ratio), (1.0, 1.0), noisy_rate=970.0, errors=errors)
        return {"noisy-4x": case_figures(case, [baseline], 1000.0)}

    met = summarize([rep(1.1), rep(1.9), rep(1.15)])["noisy-4x"]
    assert met["quiet_ratio_median"] == {"send": 1.15, "e2e": 1.15}
    assert met["met"] == {"quiet_ratio": True, "quiet_errors": True, "noisy_quota_share": True}
    missed = summarize([rep(1.3), rep(1.25), rep(1.1, errors=2)])["noisy-4x"]
    assert missed["met"] == {"quiet_ratio": False, "quiet_errors": False, "noisy_quota_share": True}


def test_a_quiet_tenant_with_nothing_measured_or_messages_lost_fails_the_case() -> None:
    baseline = _case((1.0, 1.0), (1.0, 1.0))
    silent = _case((1.0, 1.0), (1.0, 1.0), noisy_rate=970.0)
    silent["tenants"]["lt-t2"]["consume"] = {"consumed": 0, "expected": 100, "e2e_latency_ms": {"count": 0, "p99": 0.0}}
    got = case_figures(silent, [baseline], 1000.0)
    assert got["quiet_ratio"] == {"send": 1.0, "e2e": None}  # no end-to-end figure: no ratio, not 0
    assert got["quiet_errors"] == 100  # the 100 messages t2 never consumed
    verdict = summarize([{"noisy-4x": got}, {"noisy-4x": case_figures(_case((1.0, 1.0), (1.0, 1.0)), [baseline], 1e3)}])
    assert verdict["noisy-4x"]["quiet_ratio_median"]["e2e"] is None
    assert verdict["noisy-4x"]["met"]["quiet_ratio"] is False
    assert verdict["noisy-4x"]["met"]["quiet_errors"] is False


def test_a_drain_case_is_judged_on_the_quiet_tenants_and_reports_the_drain_rate() -> None:
    baseline = _case((1.0, 1.0), (1.0, 1.0))

    def rep(ratio: float, drained: float) -> dict[str, Any]:
        case = _case((ratio, ratio), (1.0, 1.0))
        case["tenants"]["lt-t0"]["consume"]["msgs_per_s"] = drained
        return {"backlog-drain": case_figures(case, [baseline], 1000.0)}

    got = summarize([rep(1.1, 40_000.0), rep(1.3, 45_000.0), rep(1.05, 43_000.0)])["backlog-drain"]
    assert got["noisy_consumed_msgs_per_s_median"] == 43_000.0
    assert got["met"] == {"quiet_ratio": True, "quiet_errors": True}  # no publish-quota share asked of it
    missed = summarize([rep(1.3, 40_000.0), rep(1.25, 45_000.0)])["backlog-drain"]
    assert missed["met"]["quiet_ratio"] is False


def test_a_drain_case_without_a_drain_rate_has_no_median_rate_and_quiet_losses_fail_it() -> None:
    baseline = _case((1.0, 1.0), (1.0, 1.0))
    case = _case((1.0, 1.0), (1.0, 1.0), errors=3)
    got = summarize([{"backlog-drain": case_figures(case, [baseline], 1000.0)}])["backlog-drain"]
    assert got["noisy_consumed_msgs_per_s_median"] is None  # not counted as 0
    assert got["met"]["quiet_errors"] is False
