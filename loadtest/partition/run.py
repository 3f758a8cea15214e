"""Harness and runner: a PartitionCluster with its Recorder and Monitor, schedules run on it, and
the issue's targets judged against each schedule's figures.

    async with Harness(options) as h:            # cluster up, load running, group settled
        result = await run_schedule(h, NAMED["cp-hold"])
        missed = missed_targets(result, lease_s=h.cluster.options.lease_s)

Targets (default lease settings):

- 0 acknowledged messages lost, 0 overlapping writable masters, the logs converged;
- a single-path cut (control plane, HA link or clients), or one member killed: at most lease +
  3 s without a SEND_OK (a master its slave cannot reach on its client address steps down);
- writes resume within 3 s of every heal of cuts;
- no event-loop stall over 100 ms during a step (where members report ``loopStallMaxMs``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from loadtest.partition.checks import AFTER_HEAL_S, Verdict, settle, verify, window_figures
from loadtest.partition.cluster import MEMBERS, ClusterOptions, PartitionCluster
from loadtest.partition.monitor import Monitor
from loadtest.partition.recorder import Recorder, RecorderOptions
from loadtest.partition.schedule import Cut, Kill, Schedule, Step

RESUME_TARGET_S = 3.0
AVAILABILITY_MARGIN_S = 3.0  # a single-path cut: at most lease + this without a SEND_OK
STALL_TARGET_MS = 100.0
WARM_UP_ACKS = 20


def _quiet(_: str) -> None:
    pass


class Harness:
    def __init__(
        self,
        options: ClusterOptions | None = None,
        *,
        root: str | None = None,
        recorder: RecorderOptions | None = None,
        log: Callable[[str], None] = _quiet,
    ) -> None:
        self.cluster = PartitionCluster(root, options)
        self.recorder_options = recorder or RecorderOptions()
        self.log = log
        self.recorder: Recorder | None = None
        self.monitor: Monitor | None = None

    async def __aenter__(self) -> Harness:
        await self.start()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        try:
            began = time.monotonic()
            await self.cluster.start()
            c = self.cluster
            self.monitor = Monitor(c)
            await self.monitor.start()
            by_addr = {c.client_addr(m): m for m in MEMBERS}
            self.recorder = Recorder(c.namesrv, c.member_of_store_port, by_addr.get, self.recorder_options)
            await self.wait_for(lambda: _linked(self.monitor), "the slave to link", 60.0)
            await self.recorder.start()
            await self.wait_for(lambda: len(self.rec.acks) >= WARM_UP_ACKS, "the first SEND_OKs", 60.0)
            self.log(f"partition cluster up in {time.monotonic() - began:.1f} s (root {c.root})")
        except BaseException:
            await self.stop()
            raise

    @property
    def rec(self) -> Recorder:
        assert self.recorder is not None
        return self.recorder

    @property
    def mon(self) -> Monitor:
        assert self.monitor is not None
        return self.monitor

    async def stop(self) -> None:
        if self.recorder is not None:
            await self.recorder.stop()
        if self.monitor is not None:
            await self.monitor.stop()
        await self.cluster.stop()

    async def wait_for(self, cond: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
            await asyncio.sleep(0.1)


def _linked(monitor: Monitor | None) -> bool:
    r = monitor.latest() if monitor is not None else None
    return r is not None and len(r.writable) == 1 and any(s.linked for s in r.members)


@dataclass
class StepRun:
    step: Step
    members: dict[str, int]  # "master" / "slave" -> member id, when the step started
    start: float = 0.0
    heal: float = 0.0
    error: str = ""


async def _act(h: Harness, action: Cut | Kill, m: int, t0: float) -> None:
    await asyncio.sleep(max(0.0, t0 + action.at_s - time.monotonic()))
    c = h.cluster
    if isinstance(action, Cut):
        proxy = c.proxy(m, action.path)
        proxy.set_mode(action.mode, flap_ms=action.flap_ms)
        await asyncio.sleep(action.duration_s)
        proxy.heal()
    else:
        c.kill(m)
        await asyncio.sleep(action.down_s)
        await c.start_member(m)


async def run_step(h: Harness, step: Step) -> StepRun:
    master = h.mon.master()
    master = master if master is not None else 0
    run = StepRun(step, {"master": master, "slave": 1 - master})
    h.log(f"  step {step.describe()}  (master: member {master})")
    run.start = time.monotonic()
    results = await asyncio.gather(
        *(_act(h, a, run.members[a.who], run.start) for a in step.actions), return_exceptions=True
    )
    run.heal = time.monotonic()
    errors = [f"{type(e).__name__}: {e}" for e in results if isinstance(e, BaseException)]
    run.error = "; ".join(errors)
    # the window's figures run until 3 s after the heal: the next step starts after them
    await asyncio.sleep(AFTER_HEAL_S)
    return run


async def run_schedule(h: Harness, schedule: Schedule) -> dict[str, Any]:
    """Run every step, then settle and check; the schedule's figures and verdict as JSON."""
    h.log(f"schedule {schedule.describe()}")
    began, began_wall = time.monotonic(), time.time()
    runs = [await run_step(h, step) for step in schedule.steps]
    verdict = Verdict()
    await settle(h.cluster, h.mon, h.rec, verdict)
    steps = []
    for r in runs:
        figures = window_figures(h.rec, h.mon, r.start, r.heal)
        steps.append({
            "kind": r.step.kind, "actions": r.step.describe(), "single_path": r.step.single_path,
            "availability_target": availability_target(r.step), "resume_target": resume_target(r.step),
            "members": r.members,
            "cut_s": round(r.heal - r.start, 2), **figures, **({"error": r.error} if r.error else {}),
        })  # fmt: skip
    await verify(h.cluster, h.mon, h.rec, began, verdict)
    result = {
        "name": schedule.name,
        "seed": schedule.seed,
        "elapsed_s": round(time.monotonic() - began, 1),
        "steps": steps,
        "verdict": verdict.brief(),
        "elections": [e for e in verdict.elections if e["elected_at"] >= began_wall - 1],
        "transitions": h.mon.transitions(began, time.monotonic()),
        "loop_stall_max_ms": _max_or_none(s["loop_stall_max_ms"] for s in steps),
    }
    h.log(f"  -> {summary_line(result)}")
    return result


def availability_target(step: Step) -> bool:
    """Whether ``lease + 3 s`` without a SEND_OK is a target for this step: one path of one
    member cut, or one member killed (another takes over within a lease)."""
    return len(step.actions) == 1


def resume_target(step: Step) -> bool:
    """Whether writes must resume within 3 s of the step's end: a heal of cuts (a killed member
    that comes back within its lease waits for that lease: one process per lease)."""
    return all(isinstance(a, Cut) for a in step.actions)


def missed_targets(result: dict[str, Any], *, lease_s: float) -> list[str]:
    v = result["verdict"]
    missed = []
    if not v["settled"]:
        missed.append("the group did not settle (one writable master, a linked slave) after the heal")
    if v["lost"] or v["changed"]:
        missed.append(f"{v['lost']} acknowledged messages lost, {v['changed']} changed")
    if v["overlapping_masters"]:
        missed.append(f"{v['overlapping_masters']} overlapping writable masters")
    if not v["converged"]:
        missed.append(f"the logs did not converge: {v.get('convergence', '')}")
    for s in result["steps"]:
        bound = lease_s + AVAILABILITY_MARGIN_S
        if s["availability_target"] and s["unavailable_s"] > bound:
            missed.append(f"{s['kind']}: {s['unavailable_s']:.1f} s without a SEND_OK (target <= {bound:g} s)")
        if s.get("resume_target", True) and s["heal_to_send_ok_s"] > RESUME_TARGET_S:
            missed.append(f"{s['kind']}: writes resumed {s['heal_to_send_ok_s']:.1f} s after the heal "
                          f"(target <= {RESUME_TARGET_S:g} s)")  # fmt: skip
        stall = s["loop_stall_max_ms"]
        if stall is not None and stall > STALL_TARGET_MS:
            missed.append(f"{s['kind']}: an event-loop stall of {stall:.0f} ms (target <= {STALL_TARGET_MS:g} ms)")
        if s.get("error"):
            missed.append(f"{s['kind']}: the step failed: {s['error']}")
    return missed


def summary_line(result: dict[str, Any]) -> str:
    v = result["verdict"]
    figs = ", ".join(
        f"{s['kind']} unavailable {s['unavailable_s']:.1f}s heal->OK {s['heal_to_send_ok_s']:.1f}s"
        for s in result["steps"]
    )
    return (f"{result['name']}: {figs}; acked {v['acked']} lost {v['lost']} overlap {v['overlapping_masters']} "
            f"converged {v['converged']} (settled in {v['settle_s']:.1f}s)")  # fmt: skip


def _max_or_none(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
