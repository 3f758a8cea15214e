"""``orbit bench partitions``: many seeded schedules of cuts, heals and kill -9 on one broker
group with failover (loadtest/partition; docs/partitions.md), and the issue's figures as JSON.

One cluster for the whole run: a control plane over an embedded PostgreSQL of its own (as
``orbit dev up`` runs it), a name server, two members whose control-plane, HA and client paths run
through proxies, the recorder's load and the monitor. Schedule ``i`` is drawn from seed
``seed + i``; after each one everything is healed and the checks run.

Reported per schedule and in total: messages acknowledged, lost, overlapping-master violations,
and per kind of cut the longest and mean time without a SEND_OK during it and from its heal to the
next SEND_OK, with the longest event-loop stall a member reported; and the targets each missed.

    python -m benchmarks.partitions --schedules 50 [--seed S] [--out FILE|DIR] [--lease-s 6]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

from benchmarks.output import emit, header, result_path
from loadtest.partition.cluster import ClusterOptions
from loadtest.partition.run import Harness, missed_targets, run_schedule
from loadtest.partition.schedule import random_schedule

MAX_SCHEDULES = 1000


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _figures(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"max": round(max(values), 3), "mean": round(statistics.fmean(values), 3), "count": len(values)}


def totals(results: list[dict[str, Any]], *, lease_s: float) -> dict[str, Any]:
    """The run's totals and its figures per kind of cut."""
    kinds: dict[str, dict[str, list[float]]] = {}
    stalls: list[float] = []
    for r in results:
        for s in r.get("steps", []):
            k = kinds.setdefault(s["kind"], {"unavailable_s": [], "heal_to_send_ok_s": []})
            k["unavailable_s"].append(s["unavailable_s"])
            k["heal_to_send_ok_s"].append(s["heal_to_send_ok_s"])
            if s["loop_stall_max_ms"] is not None:
                stalls.append(s["loop_stall_max_ms"])
    verdicts = [r["verdict"] for r in results if "verdict" in r]
    last = verdicts[-1] if verdicts else {}
    return {
        "schedules": len(results),
        "schedules_failed_to_run": sum(1 for r in results if "error" in r),
        "schedules_missing_a_target": sum(1 for r in results if r.get("missed")),
        # the checks cover every message of the run, so the last schedule's count is the run's
        "acked": last.get("acked", 0),
        "lost": max((v["lost"] for v in verdicts), default=0),
        "changed": max((v["changed"] for v in verdicts), default=0),
        "overlapping_masters": sum(v["overlapping_masters"] for v in verdicts),
        "not_converged": sum(1 for v in verdicts if not v["converged"]),
        "not_settled": sum(1 for v in verdicts if not v["settled"]),
        "tenure_checked": all(v["tenure_checked"] for v in verdicts) if verdicts else False,
        "loop_stall_max_ms": max(stalls) if stalls else None,
        "per_kind": {
            kind: {name: _figures(vals) for name, vals in figs.items()} for kind, figs in sorted(kinds.items())
        },
        "lease_s": lease_s,
    }


async def run(schedules: int, seed: int, options: ClusterOptions) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    began = time.monotonic()
    async with Harness(options, log=_log) as h:
        for i in range(schedules):
            schedule = random_schedule(seed + i)
            _log(f"[{i + 1}/{schedules}] seed {seed + i}")
            try:
                r = await run_schedule(h, schedule)
            except Exception as e:  # recorded; the run goes on with the next schedule
                r = {"name": schedule.name, "seed": schedule.seed, "error": f"{type(e).__name__}: {e}"}
                _log(f"  schedule failed: {r['error']}")
            else:
                r["missed"] = missed_targets(r, lease_s=options.lease_s)
                if not r["missed"]:
                    del r["transitions"]  # kept where a target was missed, to see what happened
                elif not h.cluster.keep:
                    h.cluster.keep = True  # and the members' logs too
                    _log(f"  a target was missed: the members' logs stay in {h.cluster.run_dir}")
            results.append(r)
    return {
        "seed": seed,
        "options": asdict(options),
        "elapsed_s": round(time.monotonic() - began, 1),
        "totals": totals(results, lease_s=options.lease_s),
        "schedules": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.partitions", description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", type=int, default=10, help="seeded schedules to run (default 10)")
    p.add_argument("--seed", type=int, help="the first schedule's seed (default: a random one, printed)")
    p.add_argument("--lease-s", type=float, default=6.0, help="failover_lease_s (default 6)")
    p.add_argument("--check-s", type=float, default=1.0, help="failover_check_interval_s (default 1)")
    p.add_argument("--out", help="also write the JSON here; a directory: partitions-<UTC time>-<git hash>.json in it")
    return run_command(p.parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Run with parsed ``--schedules``, ``--seed``, ``--lease-s``, ``--check-s``, ``--out``."""
    if not 1 <= args.schedules <= MAX_SCHEDULES:
        _log(f"--schedules must be 1..{MAX_SCHEDULES}")
        return 2
    if not (args.lease_s > 2 * args.check_s > 0):
        _log("--lease-s must be more than twice --check-s, and both > 0")
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    _log(f"orbit bench partitions: {args.schedules} schedules from seed {seed}")
    result = asyncio.run(run(args.schedules, seed, ClusterOptions(lease_s=args.lease_s, check_s=args.check_s)))
    # the command that replays this run, its seed included
    again = ["--schedules", str(args.schedules), "--seed", str(seed), "--lease-s", f"{args.lease_s:g}",
             "--check-s", f"{args.check_s:g}"]  # fmt: skip
    emit({**header("partitions", again), **result}, result_path(args.out, "partitions"))
    t = result["totals"]
    return 0 if not (t["lost"] or t["changed"] or t["overlapping_masters"]) else 1


if __name__ == "__main__":
    sys.exit(main())
