"""``orbit loadtest merge``: one result from several generators' results — load generated from
several machines against one cluster, each writing its own ``result.json``.

Cases are matched by (name, target). Counts add up; latency histograms merge exactly (they are
HdrHistograms, never percentiles averaged); rates add up (the generators ran at the same time);
timelines are aligned on each generator's wall-clock start, to the second, so the
clocks of the machines should be NTP-synchronised. The merged result is a normal result: the
report is written from it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtest.histogram import encode_hist, merge, summary_ms
from loadtest.runner import SCHEMA

COUNTS_PUBLISH = (
    "acked",
    "acked_measured",
    "errors",
    "dropped_behind_schedule",
    "msgs_per_s",
    "mb_per_s",
    "client_cpu_s",
)
COUNTS_CONSUME = ("consumed", "msgs_per_s", "out_of_order", "redelivered")


class MergeError(ValueError):
    """The inputs cannot be merged; the message says which and why."""


def _add(dst: dict[str, Any], src: dict[str, Any], keys: Sequence[str]) -> None:
    for k in keys:
        dst[k] = round(dst.get(k, 0) + src.get(k, 0), 3)


def _add_map(dst: dict[str, int], src: dict[str, int]) -> None:
    for k, v in src.items():
        dst[k] = dst.get(k, 0) + v


def _merge_publish(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"errors_by_kind": {}, "target_msgs_per_s": None}
    for p in parts:
        _add(out, p, COUNTS_PUBLISH)
        _add_map(out["errors_by_kind"], p.get("errors_by_kind", {}))
        if p.get("target_msgs_per_s"):
            out["target_msgs_per_s"] = (out["target_msgs_per_s"] or 0) + p["target_msgs_per_s"]
    for name in ("send_latency", "generator_lag"):
        hist = merge(p.get(f"{name}_hist", "") for p in parts)
        out[f"{name}_ms"] = summary_ms(hist)
        out[f"{name}_hist"] = encode_hist(hist)
    return out


def _merge_consume(parts: list[dict[str, Any]], *, expected: int) -> dict[str, Any]:
    out: dict[str, Any] = {"per_group": {}, "expected": expected}
    for c in parts:
        _add(out, c, COUNTS_CONSUME)
        _add_map(out["per_group"], c.get("per_group", {}))
    hist = merge(c["e2e_latency_hist"] for c in parts)
    out["e2e_latency_ms"] = summary_ms(hist)
    out["e2e_latency_hist"] = encode_hist(hist)
    return out


def _merge_timelines(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = min(c["start_wall_s"] for c in cases)
    bins: dict[int, dict[str, Any]] = {}
    for c in cases:
        shift = round(c["start_wall_s"] - base)
        for r in c["timeline"]:
            empty = {"published_msgs": 0, "consumed_msgs": 0, "errors": 0, "s": [], "e": []}
            b = bins.setdefault(r["t_s"] + shift, empty)
            b["published_msgs"] += r["published_msgs"]
            b["consumed_msgs"] += r["consumed_msgs"]
            b["errors"] += r["errors"]
            b["s"].append(r["send_hist"])
            b["e"].append(r["e2e_hist"])
    rows = []
    for t in sorted(bins):
        b = bins[t]
        send, e2e = merge(b.pop("s")), merge(b.pop("e"))
        rows.append({
            "t_s": t, **b,
            "send_latency_ms": summary_ms(send, (50, 99)), "e2e_latency_ms": summary_ms(e2e, (50, 99)),
            "send_hist": encode_hist(send), "e2e_hist": encode_hist(e2e),
        })  # fmt: skip
    return rows


def merge_case(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One case from the same case of several generators (all with status "ok")."""
    first = parts[0]
    out: dict[str, Any] = {k: first[k] for k in ("name", "target", "durability", "settings") if k in first}
    out["status"] = "ok"
    out["generator"] = [p.get("generator") for p in parts]
    out["start_wall_s"] = min(p["start_wall_s"] for p in parts)
    out["measure_from_wall_s"] = min(p["measure_from_wall_s"] for p in parts)
    pubs = [p["publish"] for p in parts if "publish" in p]
    if pubs:
        out["publish"] = _merge_publish(pubs)
    cons = [p["consume"] for p in parts if "consume" in p]
    if cons:
        groups = int(first.get("settings", {}).get("consumer_groups", 1))
        expected = out["publish"]["acked"] * groups if pubs else sum(c.get("expected", 0) for c in cons)
        out["consume"] = _merge_consume(cons, expected=expected)
    out["timeline"] = _merge_timelines(parts)
    return out


def merge_results(docs: Sequence[dict[str, Any]], *, sources: Sequence[str] = ()) -> dict[str, Any]:
    if not docs:
        raise MergeError("nothing to merge")
    for i, d in enumerate(docs):
        where = sources[i] if i < len(sources) else f"input {i + 1}"
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else None
            raise MergeError(f"{where}: not an {SCHEMA} result (schema {got!r})")
    names = {d["scenario"]["name"] for d in docs}
    if len(names) > 1:
        raise MergeError(f"the inputs come from different scenarios: {', '.join(sorted(names))}")
    keys: list[tuple[str, str]] = []
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        for c in d["cases"]:
            key = (c["name"], c["target"])
            if key not in by_key:
                keys.append(key)
                by_key[key] = []
            if c.get("status") == "ok":
                by_key[key].append(c)
    cases = []
    for key in keys:
        parts = by_key[key]
        if parts:
            cases.append(merge_case(parts))
        else:
            cases.append({"name": key[0], "target": key[1], "status": "not_run", "durability": "",
                          "reason": "no generator ran this case"})  # fmt: skip
    return {
        "schema": SCHEMA,
        "scenario": docs[0]["scenario"],
        "seed": None,
        "merged_from": list(sources),
        "generators_machine": [d.get("machine") for d in docs],
        "cases": cases,
    }
