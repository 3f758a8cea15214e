"""The elasticity issue's targets for an elastic (ramp) case, judged from its run; a target
missed is reported missed with the measured figure.

* ``queues_grow``: from the moment the load needs more queues — its rate past ``grow_at`` (80 %)
  of what the writable queues then sustain (``queue_capacity_msgs_per_s`` each) — until a sample
  shows more writable queues: at most 30 s, every time. Judged on the offered (scheduled) rate;
  the same on the acknowledged rate is reported beside it (the autoscaler sees only what the
  brokers took: when the machine acknowledges less than is offered, the two differ).
* ``send_p99``: each 10 s window's send p99 at most 20 ms, leaving out the windows within 10 s
  of a change (the load's breakpoints: ramp start, hold, fall; and every change of the queues).
* ``lost`` 0 and, on an ordered case, ``out_of_order`` 0 (``duplicated`` reported, not judged).
  An ordered case's topic is FIFO, which the autoscaler does not scale: its ``queues_grow`` and
  ``back_to_minimum`` are reported with ``met`` None (not judged).
* ``back_to_minimum``: the writable and readable queues at the topic's minimum (its hint's,
  ``placement.queue_count_for``) for good — from a sample on, to the end of the run — within
  300 s of the fall (0 when they were there before it and stayed).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from control_plane.placement import queue_count_for
from control_plane.scaling_policy import ScalingSettings
from loadtest.rate import RateProfile
from loadtest.scenario import Case

GROW_WITHIN_S = 30.0
SEND_P99_MS = 20.0
CHANGE_MARGIN_S = 10.0
BACK_WITHIN_S = 300.0
STEP_S = 0.5
NOT_SCALED = "an ordered (FIFO) topic is not scaled: the autoscaler refuses (a 'refuse' scaling event)"


def _writable_at(queues: list[dict[str, Any]], t: float) -> int | None:
    last = None
    for q in queues:
        if q["t_s"] > t:
            break
        last = q["writable"]
    return last


def grow_delays(queues: list[dict[str, Any]], rate_at: Any, capacity: float, until_s: float) -> list[dict[str, Any]]:
    """Each spell of need: when the rate passed grow_at of the writable queues' capacity, and
    when a sample first showed more writable queues (None: not by ``until_s``; its delay then
    counts to ``until_s``)."""
    grow_at = ScalingSettings().grow_at
    out: list[dict[str, Any]] = []
    t = queues[0]["t_s"] if queues else until_s
    while t < until_s:
        w = _writable_at(queues, t)
        if w is not None and rate_at(t) > grow_at * capacity * w:
            grew = next((q["t_s"] for q in queues if q["t_s"] >= t and q["writable"] > w), None)
            end = grew if grew is not None else until_s
            out.append({"need_at_s": round(t, 2), "writable": w, "grew_at_s": grew, "delay_s": round(end - t, 2)})
            if grew is None:
                break
            t = grew
            continue
        t += STEP_S
    return out


def settled_at(queues: list[dict[str, Any]], minimum: int) -> float | None:
    """When the queues came to ``minimum`` writable and readable and stayed there to the last
    sample (None: they are not there at the end)."""
    at = None
    for q in queues:
        at_minimum = (q["writable"], q["readable"]) == (minimum, minimum)
        at = (at if at is not None else q["t_s"]) if at_minimum else None
    return at


def _changes(case: Case, queues: list[dict[str, Any]]) -> list[float]:
    """The load's breakpoints and every sample where the queues changed."""
    ramp = case.ramp
    out = [case.warmup_s]
    if ramp is not None:
        out += [case.warmup_s + ramp.over_s, case.warmup_s + ramp.over_s + ramp.hold_s]
    for a, b in pairwise(queues):
        if (a["writable"], a["readable"]) != (b["writable"], b["readable"]):
            out.append(b["t_s"])
    return sorted(out)


def _judged(name: str, met: bool, figure: Any, bound: Any, **extra: Any) -> dict[str, Any]:
    return {"target": name, "met": met, "measured": figure, "bound": bound, **extra}


def verdicts(
    *,
    case: Case,
    profile: RateProfile,
    queues: list[dict[str, Any]],
    acked_per_s: dict[int, int],
    windows: list[dict[str, Any]],
    delivery: dict[str, Any],
    out_of_order: int | None,
) -> dict[str, Any]:
    auto = case.autoscale
    assert auto is not None
    end_s = case.warmup_s + case.duration_s
    cap = auto.queue_capacity_msgs_per_s
    offered = grow_delays(queues, profile.rate_at, cap, end_s)
    acked = grow_delays(queues, lambda t: acked_per_s.get(int(t), 0), cap, end_s)
    worst = max((g["delay_s"] for g in offered), default=0.0)
    out: dict[str, Any] = {}
    out["queues_grow"] = _judged(
        "queues grow within 30 s of the load needing them (offered rate)",
        bool(offered) and worst <= GROW_WITHIN_S,
        worst if offered else "the offered load never needed more queues",
        GROW_WITHIN_S,
        spells=offered,
        on_acknowledged_rate={
            "worst_delay_s": max((g["delay_s"] for g in acked), default=None),
            "spells": acked,
        },
    )
    changes = _changes(case, queues)
    judged: list[dict[str, Any]] = []
    left_out: list[dict[str, Any]] = []
    for w in windows:
        if not w["send_latency_ms"]["count"]:
            continue
        near = any(w["from_s"] < c + CHANGE_MARGIN_S and w["to_s"] > c - CHANGE_MARGIN_S for c in changes)
        (left_out if near else judged).append(w)
    over = [w for w in judged if w["send_latency_ms"]["p99"] > SEND_P99_MS]
    worst_p99 = max((w["send_latency_ms"]["p99"] for w in judged), default=None)
    out["send_p99"] = _judged(
        "send p99 <= 20 ms per 10 s window outside +-10 s of each change",
        bool(judged) and not over,
        worst_p99,
        SEND_P99_MS,
        windows_judged=len(judged),
        windows_left_out=len(left_out),
        windows_over=[(w["from_s"], w["send_latency_ms"]["p99"]) for w in over],
        changes_s=changes,
    )
    lost = delivery.get("lost")
    out["lost"] = _judged("0 lost", lost == 0, lost, 0, duplicated=delivery.get("duplicated"))
    if case.ordered:
        out["out_of_order"] = _judged("0 out of order (ordered variant)", out_of_order == 0, out_of_order, 0)
    minimum = queue_count_for(auto.throughput_hint_msgs_per_s)
    fall_s = case.warmup_s + (case.ramp.over_s + case.ramp.hold_s if case.ramp else 0.0)
    grew = any(q["readable"] > minimum for q in queues)
    back = settled_at(queues, minimum)
    after = round(max(0.0, back - fall_s), 2) if back is not None else None
    out["back_to_minimum"] = _judged(
        "queues back to the minimum within 300 s of the fall",
        grew and after is not None and after <= BACK_WITHIN_S,
        after if after is not None else f"not by the end of the run ({end_s - fall_s:.0f} s after the fall)",
        BACK_WITHIN_S,
        minimum=minimum,
        grew=grew,
        fall_at_s=fall_s,
    )
    out["no_tenant_action"] = _judged("no tenant action", True, 0, 0)
    if case.ordered:  # an ordered (FIFO) topic keeps its queues by design: its growth is not judged
        for name in ("queues_grow", "back_to_minimum"):
            out[name] = {**out[name], "met": None, "not_judged": NOT_SCALED}
    out["all_met"] = all(v["met"] for v in out.values() if isinstance(v, dict) and v["met"] is not None)
    return out
