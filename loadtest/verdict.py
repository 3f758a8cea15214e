"""The issue's targets for ``orbit bench e2e``, whether a run met them, and what several runs say.

One run on a shared 2-core VM is one sample of an hour whose speed drifts 2-3x (docs/broker.md):
``orbit bench e2e --runs N`` runs the whole benchmark N times, each on a fresh cluster, and
summarizes each target over the runs — how many met it, its median, lowest and highest — and
how many runs met every target together.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Target:
    name: str  # the key in a result's "targets" and "met"
    path: tuple[str, ...]  # where the figure is in a run's result
    bound: float
    at_least: bool  # True: the figure must be >= bound; False: <= bound

    def figure(self, result: dict[str, Any]) -> float | None:
        node: Any = result
        for part in self.path:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, bool) or not isinstance(node, int | float):
            return None
        return node  # as the run has it (rates are whole numbers)

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.bound if self.at_least else value <= self.bound


TARGETS = (
    Target("publish_batched_msgs_per_s", ("publish_batched", "msgs_per_s"), 200_000, True),
    Target("publish_sync_16_msgs_per_s", ("publish_sync_16", "msgs_per_s"), 50_000, True),
    Target("consume_msgs_per_s", ("consume", "msgs_per_s"), 300_000, True),
    Target("half_peak_send_p99_ms", ("half_peak", "send_latency_ms", "p99"), 5.0, False),
)
# The RocketMQ 5 gRPC endpoint's (loadtest/grpc_e2e.py; docs/rocketmq5.md): targets of the runs
# that measured it (``options.grpc``; ``--no-grpc`` leaves them out).
GRPC_TARGETS = (
    Target("grpc_batched_msgs_per_s", ("grpc_batched", "msgs_per_s"), 100_000, True),
    Target("grpc_unary_16_msgs_per_s", ("grpc_unary_16", "msgs_per_s"), 15_000, True),
    Target("grpc_receive_ack_msgs_per_s", ("grpc_receive_ack", "msgs_per_s"), 50_000, True),
    Target("grpc_half_peak_send_p99_ms", ("grpc_half_peak", "send_latency_ms", "p99"), 10.0, False),
)


def applicable(result: dict[str, Any] | None = None) -> tuple[Target, ...]:
    """The targets a run is judged by: the gRPC ones too when it measured the gRPC endpoint."""
    if result is not None and result.get("options", {}).get("grpc"):
        return TARGETS + GRPC_TARGETS
    return TARGETS


def targets(result: dict[str, Any] | None = None) -> dict[str, float]:
    """The targets as a result lists them (``result["targets"]``)."""
    return {t.name: t.bound for t in applicable(result)}


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    """Whether ``result`` met each target (a missing figure did not), and ``all`` of them."""
    met = {t.name: t.met(t.figure(result)) for t in applicable(result)}
    met["all"] = all(met.values())
    return met


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target over ``results`` (runs of the whole benchmark): its bound, in how many runs
    it was met, and the median, lowest and highest figure, with every run's figure in order."""
    if not results:
        raise ValueError("no run to summarize")
    per_target: dict[str, Any] = {}
    judged = max((applicable(r) for r in results), key=len)
    for t in judged:
        values = [t.figure(r) for r in results]
        present = [v for v in values if v is not None]
        per_target[t.name] = {
            "target": t.bound,
            "at_least": t.at_least,
            "met_runs": sum(t.met(v) for v in values),
            "median": statistics.median(present) if present else None,
            "min": min(present) if present else None,
            "max": max(present) if present else None,
            "values": values,
        }
    loop_ns = [r.get("machine", {}).get("python_loop_ns") for r in results]
    return {
        "runs": len(results),
        "failed_runs": sum("error" in r for r in results),  # runs that ended in an error: all missed
        "all_met_runs": sum(verdict(r)["all"] for r in results),
        "targets": per_target,
        # the machine's speed during each run (a Python loop iteration, ns; lower is faster)
        "python_loop_ns": loop_ns,
    }


def missed(result: dict[str, Any]) -> str:
    """A line for the log: "met every target", or the targets missed with their figures."""
    figures = [(t, t.figure(result)) for t in applicable(result)]
    out = [f"{t.name} {value}" for t, value in figures if not t.met(value)]
    return "met every target" if not out else "missed " + ", ".join(out)


def brief(result: dict[str, Any]) -> dict[str, Any]:
    """One run in a line: its target figures, what it met, and the machine's speed then (and the
    error it ended in, if it did)."""
    out = {
        "figures": {t.name: t.figure(result) for t in applicable(result)},
        "met": verdict(result),
        "python_loop_ns": result.get("machine", {}).get("python_loop_ns"),
    }
    if "error" in result:
        out["error"] = result["error"]
    return out
