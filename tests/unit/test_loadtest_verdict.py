"""``loadtest.verdict``: whether an ``orbit bench e2e`` result met the issue's targets (rates at
least theirs, the half-peak p99 at most its 5 ms; a missing figure never meets), and what
several runs say together (``--runs``)."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.verdict import TARGETS, brief, missed, summarize, targets, verdict

pytestmark = pytest.mark.unit


def result(batched: float, sync: float, consume: float, p99: float, loop_ns: float = 30.0) -> dict[str, Any]:
    """The part of a run's JSON the targets read, as ``orbit bench e2e`` lays it out."""
    return {
        "publish_batched": {"msgs_per_s": batched, "errors": 0},
        "publish_sync_16": {"msgs_per_s": sync, "send_latency_ms": {"p99": 9.0}},
        "consume": {"msgs_per_s": consume},
        "half_peak": {"send_latency_ms": {"p50": 0.6, "p99": p99, "p99.9": 8.0}},
        "machine": {"python_loop_ns": loop_ns},
    }


def test_the_targets_are_the_issues() -> None:
    assert targets() == {
        "publish_batched_msgs_per_s": 200_000,
        "publish_sync_16_msgs_per_s": 50_000,
        "consume_msgs_per_s": 300_000,
        "half_peak_send_p99_ms": 5.0,
    }


def test_a_run_at_or_past_every_bound_meets_them_all() -> None:
    assert verdict(result(250_000, 60_000, 600_000, 3.1)) == {
        "publish_batched_msgs_per_s": True,
        "publish_sync_16_msgs_per_s": True,
        "consume_msgs_per_s": True,
        "half_peak_send_p99_ms": True,
        "all": True,
    }
    # Exactly on each bound is met: rates are "at least", the p99 "at most".
    assert verdict(result(200_000, 50_000, 300_000, 5.0))["all"] is True


@pytest.mark.parametrize(
    ("run", "missed"),
    [
        (result(199_999, 60_000, 600_000, 3.0), "publish_batched_msgs_per_s"),
        (result(250_000, 49_999, 600_000, 3.0), "publish_sync_16_msgs_per_s"),
        (result(250_000, 60_000, 299_999, 3.0), "consume_msgs_per_s"),
        (result(250_000, 60_000, 600_000, 5.001), "half_peak_send_p99_ms"),
    ],
    ids=["batched", "sync", "consume", "half-peak"],
)
def test_one_figure_on_the_wrong_side_misses_that_target_and_all(run: dict[str, Any], missed: str) -> None:
    met = verdict(run)
    assert met[missed] is False
    assert met["all"] is False
    assert all(ok for name, ok in met.items() if name not in (missed, "all"))


def test_a_missing_or_non_numeric_figure_is_not_met() -> None:
    run = result(250_000, 60_000, 600_000, 3.0)
    del run["consume"]  # a phase that did not run
    run["half_peak"]["send_latency_ms"]["p99"] = None
    met = verdict(run)
    assert met["consume_msgs_per_s"] is False
    assert met["half_peak_send_p99_ms"] is False
    assert met["publish_batched_msgs_per_s"] is True
    assert met["all"] is False
    assert verdict({})["all"] is False
    run = result(250_000, 60_000, 600_000, 3.0)
    run["publish_sync_16"]["msgs_per_s"] = True  # a bool is not a figure
    assert verdict(run)["publish_sync_16_msgs_per_s"] is False


def test_runs_are_summarized_per_target_and_together() -> None:
    runs = [
        result(250_000, 60_000, 600_000, 3.0, loop_ns=25.0),  # all met
        result(190_000, 55_000, 500_000, 4.0, loop_ns=40.0),  # batched missed
        result(260_000, 48_000, 700_000, 6.5, loop_ns=35.0),  # sync and half-peak missed
        result(240_000, 52_000, 650_000, 2.5, loop_ns=28.0),  # all met
    ]
    s = summarize(runs)
    assert s["runs"] == 4
    assert s["failed_runs"] == 0
    assert s["all_met_runs"] == 2
    assert s["python_loop_ns"] == [25.0, 40.0, 35.0, 28.0]
    assert set(s["targets"]) == {t.name for t in TARGETS}
    batched = s["targets"]["publish_batched_msgs_per_s"]
    assert batched == {
        "target": 200_000,
        "at_least": True,
        "met_runs": 3,
        "median": 245_000,
        "min": 190_000,
        "max": 260_000,
        "values": [250_000, 190_000, 260_000, 240_000],
    }
    assert s["targets"]["publish_sync_16_msgs_per_s"]["met_runs"] == 3
    assert s["targets"]["consume_msgs_per_s"]["met_runs"] == 4
    half = s["targets"]["half_peak_send_p99_ms"]
    assert (half["met_runs"], half["median"], half["min"], half["max"], half["at_least"]) == (3, 3.5, 2.5, 6.5, False)


def test_a_run_without_a_figure_counts_as_a_miss_and_is_left_out_of_the_statistics() -> None:
    broken = result(250_000, 60_000, 600_000, 3.0)
    del broken["half_peak"]
    s = summarize([result(250_000, 60_000, 600_000, 4.0), broken])
    half = s["targets"]["half_peak_send_p99_ms"]
    assert half["values"] == [4.0, None]
    assert (half["met_runs"], half["median"], half["min"], half["max"]) == (1, 4.0, 4.0, 4.0)
    assert s["all_met_runs"] == 1
    nothing = summarize([{}])["targets"]["consume_msgs_per_s"]
    assert (nothing["met_runs"], nothing["median"], nothing["min"], nothing["max"]) == (0, None, None, None)


def test_no_run_is_refused() -> None:
    with pytest.raises(ValueError, match="no run"):
        summarize([])


def test_a_runs_brief_has_its_figures_verdict_and_machine_speed() -> None:
    b = brief(result(250_000, 49_000, 600_000, 3.0, loop_ns=31.5))
    assert b["figures"] == {
        "publish_batched_msgs_per_s": 250_000,
        "publish_sync_16_msgs_per_s": 49_000,
        "consume_msgs_per_s": 600_000,
        "half_peak_send_p99_ms": 3.0,
    }
    assert b["met"]["publish_sync_16_msgs_per_s"] is False
    assert b["met"]["all"] is False
    assert b["python_loop_ns"] == 31.5


def test_the_log_line_names_what_a_run_missed_with_its_figure() -> None:
    assert missed(result(250_000, 60_000, 600_000, 3.0)) == "met every target"
    line = missed(result(187_936, 60_000, 600_000, 6.9))
    assert line == "missed publish_batched_msgs_per_s 187936, half_peak_send_p99_ms 6.9"
    assert missed({}).startswith("missed publish_batched_msgs_per_s None")


def test_a_run_that_ended_in_an_error_is_counted_as_failed_and_missed_everything() -> None:
    failed = {"error": "ClusterError: broker did not start"}
    s = summarize([result(250_000, 60_000, 600_000, 3.0), failed])
    assert (s["runs"], s["failed_runs"], s["all_met_runs"]) == (2, 1, 1)
    assert all(t["met_runs"] == 1 for t in s["targets"].values())
    assert s["python_loop_ns"] == [30.0, None]
    b = brief(failed)
    assert b["error"] == "ClusterError: broker did not start"
    assert set(b["figures"].values()) == {None}
    assert not any(b["met"].values())
    assert "error" not in brief(result(250_000, 60_000, 600_000, 3.0))


def test_a_run_that_measured_the_grpc_endpoint_is_judged_by_its_targets_too() -> None:
    run = result(250_000, 60_000, 600_000, 3.0)
    run["options"] = {"grpc": True}
    assert set(targets(run)) - set(targets()) == {
        "grpc_batched_msgs_per_s", "grpc_unary_16_msgs_per_s", "grpc_receive_ack_msgs_per_s",
        "grpc_half_peak_send_p99_ms",
    }  # fmt: skip
    assert verdict(run)["all"] is False  # no gRPC figure: missed
    run |= {
        "grpc_batched": {"msgs_per_s": 100_000},
        "grpc_unary_16": {"msgs_per_s": 15_000},
        "grpc_receive_ack": {"msgs_per_s": 50_000},
        "grpc_half_peak": {"send_latency_ms": {"p99": 10.0}},
    }
    assert verdict(run)["all"] is True  # each exactly on its bound
    run["grpc_half_peak"]["send_latency_ms"]["p99"] = 10.5
    met = verdict(run)
    assert (met["grpc_half_peak_send_p99_ms"], met["all"]) == (False, False)
    assert "grpc_half_peak_send_p99_ms 10.5" in missed(run)
    # Several runs: the gRPC targets are summarized when any run measured them.
    assert "grpc_batched_msgs_per_s" in summarize([run, result(250_000, 60_000, 600_000, 3.0)])["targets"]
