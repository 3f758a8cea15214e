"""Histogram merge and result merge (``orbit loadtest merge``): counts add up exactly, merged
percentiles equal those of one histogram holding every value, timelines align on wall-clock
starts, and inputs that do not belong together are refused."""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest

from loadtest import histogram as h
from loadtest.merge import MergeError, merge_results
from loadtest.runner import SCHEMA

pytestmark = pytest.mark.unit


def _values(rng: random.Random, n: int) -> list[int]:
    return [int(rng.lognormvariate(7, 1.5)) + 1 for _ in range(n)]  # µs, a long tail


def test_merged_histograms_equal_one_histogram_of_all_values(seed: int) -> None:
    rng = random.Random(seed)
    parts = [_values(rng, rng.randrange(1, 5000)) for _ in range(4)]
    merged = h.merge(h.encode_hist(h.hist_of(p)) for p in parts)
    whole = h.hist_of([v for p in parts for v in p])
    assert merged.get_total_count() == whole.get_total_count() == sum(len(p) for p in parts)
    for pct in (50, 90, 99, 99.9, 100):
        assert merged.get_value_at_percentile(pct) == whole.get_value_at_percentile(pct)
    assert h.summary_ms(merged) == h.summary_ms(whole)


def test_empty_histograms_encode_to_nothing_and_merge_as_nothing() -> None:
    assert h.encode_hist(h.new_hist()) == ""
    assert h.merge(["", ""]).get_total_count() == 0
    assert h.summary_ms(h.decode_hist("")) == {"count": 0, "p50": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
    assert h.distribution_ms(h.new_hist()) == []


def test_values_out_of_range_are_clamped_not_lost() -> None:
    hist = h.hist_of([0, 10**12])
    assert hist.get_total_count() == 2
    assert hist.get_max_value() >= h.HIGHEST_US


def _case(
    rng: random.Random, *, start: float, published: list[int], consumed: list[int]
) -> tuple[dict[str, Any], list[int], list[int]]:
    """A generator's case with per-second counts ``published``/``consumed``; its latencies too."""
    send, e2e = _values(rng, sum(published)), _values(rng, sum(consumed))
    timeline, si, ei = [], 0, 0
    for t, (p, c) in enumerate(zip(published, consumed, strict=True)):
        sh, eh = h.hist_of(send[si : si + p]), h.hist_of(e2e[ei : ei + c])
        si, ei = si + p, ei + c
        timeline.append({"t_s": t, "published_msgs": p, "consumed_msgs": c, "errors": 0,
                         "send_hist": h.encode_hist(sh), "e2e_hist": h.encode_hist(eh)})  # fmt: skip
    case = {
        "name": "steady", "target": "orbit", "durability": "d", "status": "ok",
        "settings": {"consumer_groups": 1}, "generator": {"host": "x"},
        "start_wall_s": start, "measure_from_wall_s": start + 1,
        "publish": {"acked": sum(published), "acked_measured": sum(published), "errors": 1,
                    "errors_by_kind": {"FlowControlError": 1}, "dropped_behind_schedule": 0,
                    "target_msgs_per_s": 100.0, "msgs_per_s": 50.0, "mb_per_s": 0.05, "client_cpu_s": 1.25,
                    "send_latency_hist": h.encode_hist(h.hist_of(send))},
        "consume": {"consumed": sum(consumed), "expected": sum(published), "per_group": {"g": sum(consumed)},
                    "msgs_per_s": 40.0, "out_of_order": 0, "redelivered": 2,
                    "e2e_latency_hist": h.encode_hist(h.hist_of(e2e))},
        "timeline": timeline,
    }  # fmt: skip
    return case, send, e2e


def _doc(*cases: dict[str, Any], scenario: str = "steady") -> dict[str, Any]:
    return {"schema": SCHEMA, "scenario": {"name": scenario}, "cases": list(cases)}


def test_results_of_two_generators_merge_into_one(seed: int) -> None:
    rng = random.Random(seed)
    a, a_send, a_e2e = _case(rng, start=1000.0, published=[10, 20, 30], consumed=[5, 25, 30])
    b, b_send, b_e2e = _case(rng, start=1002.2, published=[7, 8], consumed=[7, 8])  # started 2 s later
    doc = merge_results([_doc(a), _doc(b)], sources=["a.json", "b.json"])
    assert doc["schema"] == SCHEMA
    assert doc["merged_from"] == ["a.json", "b.json"]
    (c,) = doc["cases"]
    pub, con = c["publish"], c["consume"]
    assert pub["acked"] == 75
    assert pub["errors"] == 2
    assert pub["errors_by_kind"] == {"FlowControlError": 2}
    assert pub["msgs_per_s"] == 100.0
    assert pub["target_msgs_per_s"] == 200.0
    assert pub["client_cpu_s"] == 2.5  # the generators' producer CPU, summed
    assert con["consumed"] == 75
    assert con["expected"] == 75
    assert con["per_group"] == {"g": 75}
    assert con["redelivered"] == 4
    assert pub["send_latency_ms"] == h.summary_ms(h.hist_of(a_send + b_send))
    assert con["e2e_latency_ms"] == h.summary_ms(h.hist_of(a_e2e + b_e2e))
    # b's seconds 0 and 1 are the run's seconds 2 and 3.
    rows = {r["t_s"]: r for r in c["timeline"]}
    assert {t: r["published_msgs"] for t, r in rows.items()} == {0: 10, 1: 20, 2: 37, 3: 8}
    assert rows[2]["send_latency_ms"]["count"] == 37
    assert c["start_wall_s"] == 1000.0
    assert len(c["generator"]) == 2


def test_a_case_only_some_generators_ran_is_merged_from_those(seed: int) -> None:
    rng = random.Random(seed)
    a, _, _ = _case(rng, start=5.0, published=[3], consumed=[3])
    failed = {"name": "steady", "target": "orbit", "status": "failed", "reason": "x"}
    (c,) = merge_results([_doc(a), _doc(failed)])["cases"]
    assert c["status"] == "ok"
    assert c["publish"]["acked"] == 3
    (c,) = merge_results([_doc(failed)])["cases"]
    assert c["status"] == "not_run"


def test_inputs_that_do_not_belong_together_are_refused() -> None:
    with pytest.raises(MergeError, match="nothing to merge"):
        merge_results([])
    with pytest.raises(MergeError, match=r"b.json: not an orbit-loadtest/1 result \(schema 'other/1'\)"):
        merge_results([_doc(), {"schema": "other/1"}], sources=["a.json", "b.json"])
    with pytest.raises(MergeError, match="different scenarios: burst, steady"):
        merge_results([_doc(), _doc(scenario="burst")])


def test_a_latency_log_holds_what_a_list_would_and_has_no_element_the_collector_walks() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    values = [rng.randrange(0, 10**8) for _ in range(2_000)]
    log = h.latency_log()
    for v in values:
        log.append(v)
    assert list(log) == values
    assert h.summary_ms(h.hist_of(log)) == h.summary_ms(h.hist_of(values))
    # What a collection visits in it: no element (a list of them: every one, each collection).
    assert not [r for r in gc.get_referents(log) if not isinstance(r, type)]
    assert len(gc.get_referents(values)) == len(values)
