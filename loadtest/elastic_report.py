"""An elastic case's report: the run in 10 s windows, the topic's queues over time, and the
verdicts against the elasticity issue's targets (``elastic_verdict.py``).

Times are seconds since the run's start (the warm-up first), as in the timeline. The offered
rate is the open-loop schedule's (what the generators were told to send), the acknowledged rate
what the brokers answered; a window's latencies are its measured sends' (after the warm-up).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from loadtest.elastic_verdict import verdicts
from loadtest.histogram import merge, summary_ms
from loadtest.rate import RateProfile
from loadtest.scenario import Case

WINDOW_S = 10.0


def windows(
    case: Case, rows: list[dict[str, Any]], profile: RateProfile, queues: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per WINDOW_S of the run: offered and acknowledged msgs/s, errors, send p50/p99,
    end-to-end p99, and the writable/readable queues last sampled in it."""
    total_s = case.warmup_s + case.duration_s
    out = []
    for w in range(math.ceil(total_s / WINDOW_S - 1e-9)):
        a, b = w * WINDOW_S, min(total_s, (w + 1) * WINDOW_S)
        mine = [r for r in rows if a <= r["t_s"] < b]
        send = merge(r["send_hist"] for r in mine if r["send_hist"])
        e2e = merge(r["e2e_hist"] for r in mine if r["e2e_hist"])
        sampled = [q for q in queues if a <= q["t_s"] < b]
        out.append({
            "from_s": a,
            "to_s": b,
            "offered_msgs_per_s": round(profile.count_between(a, b) / (b - a), 1),
            "acked_msgs_per_s": round(sum(r["published_msgs"] for r in mine) / (b - a), 1),
            "consumed_msgs_per_s": round(sum(r["consumed_msgs"] for r in mine) / (b - a), 1),
            "errors": sum(r["errors"] for r in mine),
            "send_latency_ms": summary_ms(send, (50, 99)),
            "e2e_latency_ms": summary_ms(e2e, (50, 99)),
            "writable_queues": sampled[-1]["writable"] if sampled else None,
            "readable_queues": sampled[-1]["readable"] if sampled else None,
        })  # fmt: skip
    return out


def _seconds(at: Any, start_wall_s: float) -> float | None:
    try:
        return round(datetime.fromisoformat(str(at)).timestamp() - start_wall_s, 2)
    except ValueError:
        return None


def elastic_result(case: Case, loaded: dict[str, Any], watched: dict[str, Any], profile: RateProfile) -> dict[str, Any]:
    """The ``elastic`` part of an elastic case's result."""
    auto = case.autoscale
    assert auto is not None
    start = float(loaded.get("start_wall_s", 0.0))
    queues = [
        {"t_s": round(t - start, 2), "writable": w, "readable": r} for t, w, r in watched["samples"] if t >= start - 5
    ]
    events = [{**e, "t_s": _seconds(e.get("at"), start)} for e in watched["events"]]
    rows = loaded.get("timeline", [])
    table = windows(case, rows, profile, queues)
    acked_per_s = {r["t_s"]: r["published_msgs"] for r in rows}
    publish = loaded.get("publish", {})
    out: dict[str, Any] = {
        "settings": {
            "autoscale_interval_s": auto.interval_s,
            "queue_capacity_msgs_per_s": auto.queue_capacity_msgs_per_s,
            "scale_window_s": auto.window_s,
            "scale_down_after_s": auto.down_after_s,
            "load_report_interval_s": auto.load_report_interval_s,
            "route_refresh_ms": auto.route_refresh_ms,
            "broker_groups": auto.broker_groups,
            "throughput_hint_msgs_per_s": auto.throughput_hint_msgs_per_s,
            "topic_message_type": "FIFO" if case.ordered else "NORMAL",
        },
        "windows": table,
        "queues": queues,
        "queue_watch_errors": watched["errors"],
        "scaling_events": events,
        "refusals": publish.get("errors_by_kind", {}),
        "dropped_behind_schedule": publish.get("dropped_behind_schedule", 0),
        # After the tenant, its topic, group and credential are made (as the operator), the
        # harness makes no API call for the tenant: the queues' changes are the autoscaler's.
        "tenant_api_calls_during_run": 0,
    }
    out["verdicts"] = verdicts(
        case=case,
        profile=profile,
        queues=queues,
        acked_per_s=acked_per_s,
        windows=table,
        delivery=loaded.get("delivery", {}),
        out_of_order=loaded.get("consume", {}).get("out_of_order"),
    )
    return out


def plot_rows(result: dict[str, Any]) -> dict[str, list[Any]]:
    """The series the plot draws (kept apart so that tests can read them without matplotlib)."""
    el = result["elastic"]
    return {
        "t": [r["t_s"] + 0.5 for r in result["timeline"]],
        "acked": [r["published_msgs"] for r in result["timeline"]],
        "q_t": [q["t_s"] for q in el["queues"]],
        "writable": [q["writable"] for q in el["queues"]],
        "readable": [q["readable"] for q in el["queues"]],
        "w_t": [(w["from_s"] + w["to_s"]) / 2 for w in el["windows"]],
        "offered": [w["offered_msgs_per_s"] for w in el["windows"]],
        "send_p99": [w["send_latency_ms"]["p99"] if w["send_latency_ms"]["count"] else None for w in el["windows"]],
    }
