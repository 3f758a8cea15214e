"""The noisy-neighbour targets, over repeated runs: ``python -m benchmarks.noisy_neighbour``.

One run of a noisy-neighbour case sets a quiet tenant's p99 against a baseline measured in the
same minutes; on a shared two-core machine one run's p99 moves by a third between runs. This runs
the scenario ``--repeat`` times (every case in each repetition, each against that repetition's
baseline) and reports, per case, the quiet tenants' worst ratio to the baseline (send and end-to-end
p99; the baseline runs before the cases and again after them, and each quiet tenant's p99 is
their mean) in each repetition and its median, their errors, the noisy tenant's share of its quota, the
brokers' CPU and refusals, the noisy tenant's own client CPU, and each repetition's two baselines'
quiet p99s (``baselines_quiet_p99_ms``: how far the hour moved them). Targets (issue: noisy neighbours):
quiet ratios ≤ 1.2 with no errors, the flooding tenant ≥ 95 % of its quota acknowledged; in the
``backlog-drain`` case (the noisy tenant drains a stored backlog at its consume quota) the quiet
ratios and errors alone.

The ``cpu-neighbour`` case is the control: the baseline beside a process of the noisy tenant's
that only spins, at the same niceness as its clients — what a co-located client's CPU alone costs.

    python -m benchmarks.noisy_neighbour [--repeat 3] [--case NAME ...] [--seed 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from typing import Any

from benchmarks.output import emit, header
from data_plane.interpreter import interpreter_facts
from loadtest import runner
from loadtest import scenario as sc

RATIO_TARGET = 1.2
QUOTA_SHARE_TARGET = 0.95
FLOOD_CASES = ("noisy-4x", "noisy-20x", "connection-storm")
DRAIN_CASES = ("backlog-drain",)  # judged on the quiet tenants alone (the noisy one consumes)
# judged on the quiet tenants alone: the noisy one bursts within its quota, taking what the broker can do
BURST_CASES = ("burst-in-quota",)


def _quiet(case: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for _, v in sorted(case["tenants"].items()) if not v["noisy"]]


def _p99(v: dict[str, Any], kind: str) -> float | None:
    """A tenant's send or end-to-end p99; None when it has none (nothing acknowledged or consumed)."""
    lat = v.get("send_latency_ms") if kind == "send" else v.get("consume", {}).get("e2e_latency_ms")
    if not lat or not lat.get("count"):
        return None
    return float(lat["p99"])


def _ratio(values: list[float | None], base: list[list[float | None]]) -> float | None:
    """The worst tenant's p99 over the mean of its baselines'; None when any figure is missing."""
    worst = 0.0
    for v, bs in zip(values, base, strict=True):
        if v is None or any(b is None or b <= 0 for b in bs):
            return None
        worst = max(worst, v / statistics.fmean(b for b in bs if b is not None))
    return round(worst, 3)


def _lost(v: dict[str, Any]) -> int:
    """A quiet tenant's failures: errors, sends dropped behind schedule, messages not consumed."""
    consume = v.get("consume") or {}
    missing = max(0, consume.get("expected", 0) - consume.get("consumed", 0))
    return int(v["errors"] + v.get("dropped_behind_schedule", 0) + missing)


def case_figures(case: dict[str, Any], baselines: list[dict[str, Any]], quota: float) -> dict[str, Any]:
    """One case of one repetition against that repetition's baselines (each quiet tenant's p99
    against the mean of its p99 in them: one run before the cases and one after)."""
    quiet = _quiet(case)
    p99 = {kind: [_p99(v, kind) for v in quiet] for kind in ("send", "e2e")}
    ratios = {}
    for kind, values in p99.items():
        base = [[_p99(v, kind) for v in vs] for vs in zip(*(_quiet(b) for b in baselines), strict=True)]
        ratios[kind] = _ratio(values, base)
    noisy = next(v for v in case["tenants"].values() if v["noisy"])
    return {
        "quiet_send_p99_ms": p99["send"],
        "quiet_e2e_p99_ms": p99["e2e"],
        "quiet_ratio": ratios,
        "quiet_errors": sum(_lost(v) for v in quiet),
        "noisy_acked_msgs_per_s": noisy["msgs_per_s"],
        "noisy_quota_share": round(noisy["msgs_per_s"] / quota, 3),
        "noisy_client_cpu_s": noisy.get("client_cpu_s"),
        "noisy_consumed_msgs_per_s": (noisy.get("consume") or {}).get("msgs_per_s"),
        "broker": case.get("broker_cost"),
        "cpu_burner_s": (case.get("cpu_burner") or {}).get("cpu_s"),
    }


def summarize(reps: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per case: the median of each repetition's worst quiet ratio (None if any repetition has
    none), and whether the targets hold."""
    out: dict[str, Any] = {}
    for name in reps[0]:
        rows = [r[name] for r in reps if name in r]
        med: dict[str, float | None] = {}
        for kind in ("send", "e2e"):
            values = [x["quiet_ratio"][kind] for x in rows]
            med[kind] = None if None in values else round(statistics.median(values), 3)
        share = statistics.median(x["noisy_quota_share"] for x in rows)
        out[name] = {
            "quiet_ratio_median": med,
            "quiet_ratio_runs": [x["quiet_ratio"] for x in rows],
            "quiet_errors": sum(x["quiet_errors"] for x in rows),
            "noisy_quota_share_median": share,
        }
        if name in FLOOD_CASES:
            out[name]["met"] = {
                "quiet_ratio": all(v is not None and v <= RATIO_TARGET for v in med.values()),
                "quiet_errors": out[name]["quiet_errors"] == 0,
                "noisy_quota_share": share >= QUOTA_SHARE_TARGET,
            }
        elif name in BURST_CASES:
            out[name]["noisy_acked_msgs_per_s_median"] = statistics.median(x["noisy_acked_msgs_per_s"] for x in rows)
            out[name]["met"] = {
                "quiet_ratio": all(v is not None and v <= RATIO_TARGET for v in med.values()),
                "quiet_errors": out[name]["quiet_errors"] == 0,
            }
        elif name in DRAIN_CASES:
            drained = [x["noisy_consumed_msgs_per_s"] for x in rows]
            out[name]["noisy_consumed_msgs_per_s_median"] = (
                None if None in drained else statistics.median(d for d in drained if d is not None)
            )
            out[name]["met"] = {
                "quiet_ratio": all(v is not None and v <= RATIO_TARGET for v in med.values()),
                "quiet_errors": out[name]["quiet_errors"] == 0,
            }
    return out


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.noisy_neighbour", description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the whole scenario (default 3)")
    ap.add_argument("--case", action="append", default=[], help="only this case (repeatable; baseline always runs)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--broker-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker setting for every case (repeatable), e.g. fair_share=false for the comparison",
    )
    ap.add_argument(
        "--noisy-own-cpu",
        action="store_true",
        help="tenant 0's clients on a CPU of their own, everything else on the others (every case, baselines too)",
    )
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    if not 1 <= args.repeat <= 20:
        ap.error("--repeat: 1..20")
    scen = sc.load("noisy-neighbour")
    broker_set = []
    for kv in args.broker_set:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            ap.error(f"--broker-set: {kv!r} is not KEY=VALUE")
        broker_set.append((key.strip(), value.strip()))
    if broker_set:
        cases = tuple(dataclasses.replace(c, broker_set=tuple(sorted(broker_set))) for c in scen.cases)
        scen = dataclasses.replace(scen, cases=cases)
    if args.noisy_own_cpu:
        cases = tuple(
            dataclasses.replace(c, tenants=dataclasses.replace(c.tenants, noisy_own_cpu=True)) if c.tenants else c
            for c in scen.cases
        )
        scen = dataclasses.replace(scen, cases=cases)
    names = {c.name for c in scen.cases}
    unknown = sorted(set(args.case) - names)
    if unknown:
        ap.error(f"--case: {unknown[0]!r} is not a case of noisy-neighbour ({', '.join(sorted(names))})")
    only = tuple(dict.fromkeys(["baseline", *args.case])) if args.case else ()
    quota = {  # tenant 0's publish quota in each case
        c.name: float(c.tenants.noisy_publish_quota_msgs_per_s or c.tenants.publish_quota_msgs_per_s)
        for c in scen.cases
        if c.tenants is not None
    }
    reps: list[dict[str, dict[str, Any]]] = []
    base_p99: list[list[dict[str, list[float | None]]]] = []  # per repetition: before, after
    failed: list[str] = []
    for k in range(args.repeat):
        print(f"repetition {k + 1} of {args.repeat}", file=sys.stderr, flush=True)
        docs = [  # the baseline first (with the cases, in the scenario's order) and again after them
            runner.run(scen, runner.RunOptions(run_peers=False, only_cases=only, seed=args.seed), log=_log),
            runner.run(scen, runner.RunOptions(run_peers=False, only_cases=("baseline",), seed=args.seed), log=_log),
        ]
        ran = [c for doc in docs for c in doc["cases"]]
        bad = [c for c in ran if c.get("status") != "ok"]
        failed = [f"{c['name']}: {c.get('status')} ({c.get('reason', '')[-300:]})" for c in bad]
        if failed:  # what ran before is still reported
            print(f"repetition {k + 1}: cases that failed or did not run: {failed}", file=sys.stderr)
            break
        baselines = [c for c in ran if c["name"] == "baseline"]
        reps.append({c["name"]: case_figures(c, baselines, quota[c["name"]]) for c in ran if c["name"] != "baseline"})
        # The two baselines themselves, so a reader can see how far the hour moved them.
        base_p99.append([{kind: [_p99(v, kind) for v in _quiet(b)] for kind in ("send", "e2e")} for b in baselines])
    result = {
        **header("noisy_neighbour", argv),
        "machine": {"cpus": os.cpu_count(), **interpreter_facts()},
        "broker_set": dict(broker_set),
        "noisy_own_cpu": args.noisy_own_cpu,
        "targets": {"quiet_ratio_max": RATIO_TARGET, "noisy_quota_share_min": QUOTA_SHARE_TARGET},
        "summary": summarize(reps) if reps else {},
        "repetitions": reps,
        "baselines_quiet_p99_ms": base_p99,
        "failed": failed,
    }
    emit(result, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
