"""Runs a scenario: for each case and each target (Orbit, then the scenario's peers), a fresh
server, the generator processes, the live progress line, and one case result.

The parent process generates no load. It starts the generators (``loadtest/workers.py``), waits
until all report ready, then sets one start time for all of them, bins their one-second ticks
into a timeline, starts the consumers of a backlog case once enough is stored, and stops the
consumers once they have read everything the producers had acknowledged (or after the drain
timeout). Results carry every latency histogram encoded, so runs from several machines merge
without loss (``loadtest/merge.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadtest import cpu_split
from loadtest import progress as progress_line
from loadtest.histogram import encode_hist, merge, summary_ms
from loadtest.rate import RateProfile
from loadtest.scenario import Case, Scenario
from loadtest.targets import (
    OrbitServer,
    RemoteOrbit,
    Server,
    durability,
    group_names,
    peer_server,
    tenant_name,
    topic_names,
)
from loadtest.workers import ConsumerJob, ProducerJob, burner_main, consumer_main, producer_main

READY_TIMEOUT_S = 120.0
SCHEMA = "orbit-loadtest/1"
KAFKA_NOTE = (
    "no Kafka-compatible broker is installable from the package registries reachable here (PyPI, Debian, "
    "npm): Debian has only Kafka clients, PyPI/npm only clients and wrappers that download a broker at run "
    "time, and the one packaged Kafka-protocol server is memory-only (no durability to compare)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    data_dir: str | None = None  # servers' state (default: a temporary directory, removed after)
    run_peers: bool = True
    remote: dict[str, Any] | None = None  # generator-only: the target spec of a cluster run elsewhere
    create_topics: bool = True  # generator-only: create the topics first
    role: str = "all"  # generator-only: "producers", "consumers" or "all"
    only_cases: tuple[str, ...] = ()
    seed: int = 0
    show_progress: bool | None = None  # None: when stderr is a terminal


@dataclass
class _Timeline:
    """Per-second bins: second k is ``[start + k, start + k + 1)`` of the run, warm-up included."""

    bins: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, role: str, t_s: int, n_all: int, n_measured: int, errors: int, hist: str) -> None:
        b = self.bins.setdefault(t_s, {"published": 0, "consumed": 0, "errors": 0, "send": [], "e2e": []})
        b["published" if role == "producer" else "consumed"] += n_all
        b["errors"] += errors
        if hist:
            b["send" if role == "producer" else "e2e"].append(hist)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for t in sorted(self.bins):
            b = self.bins[t]
            send, e2e = merge(b["send"]), merge(b["e2e"])
            out.append({
                "t_s": t,
                "published_msgs": b["published"],
                "consumed_msgs": b["consumed"],
                "errors": b["errors"],
                "send_latency_ms": summary_ms(send, (50, 99)),
                "e2e_latency_ms": summary_ms(e2e, (50, 99)),
                "send_hist": encode_hist(send),
                "e2e_hist": encode_hist(e2e),
            })  # fmt: skip
        return out


def _profile(case: Case, msgs_per_s: float) -> RateProfile:
    """The case's schedule at ``msgs_per_s`` (a ramp's rates scaled by ``msgs_per_s`` over the
    case's rate, so each generator's share keeps the shape)."""
    r = case.ramp
    if r is not None:
        k = msgs_per_s / case.rate_msgs_per_s
        return RateProfile.ramp(
            start_msgs_per_s=msgs_per_s, lead_s=case.warmup_s, to=r.to * k, over_s=r.over_s,
            hold_s=r.hold_s, fall_to=r.fall_to * k, fall_s=r.fall_s,
        )  # fmt: skip
    b = case.burst
    return RateProfile.steady(
        msgs_per_s=msgs_per_s,
        duration_s=case.warmup_s + case.duration_s,
        burst_at_s=case.warmup_s + (b.at_s if b else 0.0),
        burst_duration_s=b.duration_s if b else 0.0,
        burst_factor=b.factor if b else 1.0,
    )


def _producer_jobs(
    case: Case, spec: dict[str, Any], tenants: list[Any], seed: int, noisy_cpus: tuple[int, ...] = ()
) -> list[ProducerJob]:
    """One job a producer process; tenant 0's on ``noisy_cpus`` (its own CPU; (): not pinned)."""
    jobs = []
    noisy_connections = case.tenants.noisy_connections if case.tenants else 0
    for i in range(case.producers):
        tenant = tenants[i % len(tenants)] if tenants else None
        noisy = tenant is not None and i % len(tenants) == 0
        pspec, topics = (tenant.spec, tenant.topics) if tenant else (spec, topic_names(case))
        segments: tuple[tuple[float, float, float], ...] = ()
        if case.open_loop:
            if tenant is not None and case.tenants is not None:
                same = [j for j in range(case.producers) if j % len(tenants) == i % len(tenants)]
                quiet_rate = case.rate_msgs_per_s / max(1, len(tenants) - 1)  # the quiet tenants share the rate
                rate = case.tenants.noisy_rate_msgs_per_s if i % len(tenants) == 0 else quiet_rate
                share = rate / len(same)
            else:
                share = case.rate_msgs_per_s / case.producers
            sends = _profile(case, share / case.batch)
            segments = tuple((s.start_s, s.end_s, s.msgs_per_s) for s in sends.segments)
        jobs.append(
            ProducerJob(
                index=i,
                tenant=tenant.tenant if tenant else None,
                spec=pspec,
                topics=topics,
                message_bytes=case.message_bytes,
                batch=case.batch,
                connections=noisy_connections if noisy and noisy_connections else case.connections,
                in_flight=case.in_flight,
                ordered=case.ordered,
                keys=case.keys,
                segments=segments,
                warmup_s=case.warmup_s,
                duration_s=case.duration_s,
                seed=seed * 1000 + i,
                nice=case.tenants.noisy_nice if noisy and case.tenants else 0,
                track=case.autoscale is not None,
                cpus=noisy_cpus if noisy else (),
            )
        )
    return jobs


def _consumer_jobs(
    case: Case, spec: dict[str, Any], tenants: list[Any], noisy_cpus: tuple[int, ...] = ()
) -> list[ConsumerJob]:
    """One job a consumer process; tenant 0's on ``noisy_cpus`` (its own CPU; (): not pinned)."""
    jobs = []
    for i in range(case.consumers):
        tenant = tenants[i % len(tenants)] if tenants else None
        jobs.append(
            ConsumerJob(
                index=i,
                tenant=tenant.tenant if tenant else None,
                spec=tenant.spec if tenant else spec,
                groups=tenant.groups if tenant else group_names(case),
                topics=tenant.topics if tenant else topic_names(case),
                ordered=case.ordered,
                warmup_s=case.warmup_s,
                track=case.autoscale is not None,
                cpus=noisy_cpus if tenant is not None and i % len(tenants) == 0 else (),
            )
        )
    return jobs


def run_case(
    case: Case, server: Server, *, target: str, opts: RunOptions, log: Callable[[str], None]
) -> dict[str, Any]:
    """One case against one server: start it, load it, stop it; the case result."""
    result: dict[str, Any] = {
        "name": case.name,
        "target": target,
        "durability": durability(target, case),
        "settings": case.describe(),
        "generator": {"host": socket.gethostname(), "role": opts.role},
    }
    if case.tenants is not None and case.tenants.noisy_own_cpu:
        try:
            noisy, others = cpu_split.split()
        except cpu_split.CpuSplitError as e:
            log(f"  {case.name} on {target}: not run: {e}")
            return {**result, "status": "not_run", "reason": str(e)}
        # The servers and the other tenants' clients start from here: on the CPUs tenant 0's are not on.
        with cpu_split.others_on(others):
            return _run_case(case, server, result, target=target, opts=opts, log=log, noisy_cpus=noisy)
    return _run_case(case, server, result, target=target, opts=opts, log=log)


def _run_case(
    case: Case, server: Server, result: dict[str, Any], *, target: str, opts: RunOptions,
    log: Callable[[str], None], noisy_cpus: tuple[int, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    try:
        spec = server.start()
        if hasattr(server, "members"):
            result["brokers"] = server.members()
        server.prepare(spec, topics=topic_names(case), queues=case.queues)
    except Exception as e:  # any set-up failure: this case is not run, the others still are
        server.stop()
        log(f"  {case.name} on {target}: not run: {e}")
        return {**result, "status": "not_run", "reason": str(e)}
    try:
        sample = getattr(server, "broker_sample", None)
        before = sample() if sample is not None else None
        watch = getattr(server, "queue_watch", None)
        if watch is not None:
            watch.start()
        try:
            loaded = _load(case, spec, getattr(server, "tenants", []), opts=opts, log=log, noisy_cpus=noisy_cpus)
        finally:
            watched = watch.stop() if watch is not None else None
        if sample is not None and before is not None:
            loaded["broker_cost"] = broker_cost(before, sample())
        if watched is not None:
            from loadtest.elastic_report import elastic_result

            loaded["elastic"] = elastic_result(case, loaded, watched, _profile(case, case.rate_msgs_per_s))
        return {**result, **loaded}
    except RuntimeError as e:
        log(f"  {case.name} on {target}: failed: {e}")
        return {**result, "status": "failed", "reason": str(e)[-4000:]}
    finally:
        server.stop()


def _load(
    case: Case, spec: dict[str, Any], tenants: list[Any], *, opts: RunOptions, log: Callable[[str], None],
    noisy_cpus: tuple[int, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    q: Any = ctx.Queue()
    start_wall = ctx.Value("d", 0.0)
    start_evt, stop_evt = ctx.Event(), ctx.Event()
    pjobs = _producer_jobs(case, spec, tenants, opts.seed, noisy_cpus) if opts.role in ("all", "producers") else []
    cjobs = _consumer_jobs(case, spec, tenants, noisy_cpus) if opts.role in ("all", "consumers") else []
    procs = [ctx.Process(target=producer_main, args=(j, q, start_wall), daemon=True) for j in pjobs]
    procs += [
        ctx.Process(target=consumer_main, args=(j, q, start_wall, start_evt, stop_evt), daemon=True) for j in cjobs
    ]
    if case.tenants is not None and case.tenants.noisy_cpu_burn and opts.role in ("all", "producers"):
        burn = (case.tenants.noisy_nice, q, start_wall, case.warmup_s + case.duration_s, stop_evt, noisy_cpus)
        procs.append(ctx.Process(target=burner_main, args=burn, daemon=True))
    for p in procs:
        p.start()
    timeline = _Timeline()
    done: dict[tuple[str, int], dict[str, Any]] = {}
    bar = progress_line.Progress(enabled=opts.show_progress)
    totals = {"producer": 0, "consumer": 0, "errors": 0}
    last_rates: dict[str, tuple[float, Any]] = {}  # generator -> (when, its last tick's (count, hist))
    shown = 0.0
    last_delivery = 0.0  # wall time of the last tick in which a consumer received something
    consumers_started_s: float | None = None
    producers_done_s: float | None = None
    try:
        ready = 0
        deadline = time.monotonic() + READY_TIMEOUT_S
        while ready < len(procs):
            msg = _get(q, deadline, procs, "report ready")
            if msg is not None:
                kind, role, index, payload = msg
                if kind == "failed":
                    raise RuntimeError(f"{role} {index} failed:\n{payload}")
                ready += kind == "ready"
        start = time.time() + 0.5
        start_wall.value = start
        if not case.consumers_start_after_msgs:
            start_evt.set()
            consumers_started_s = start
        total_s = case.warmup_s + case.duration_s
        hard_deadline = time.monotonic() + total_s + case.drain_timeout_s + 120
        while len(done) < len(procs):
            now = time.time()
            consumers_only_after_run = not pjobs and cjobs and now > start + total_s and not stop_evt.is_set()
            idle = now - max(last_delivery, start + total_s) > 3 or now > start + total_s + case.drain_timeout_s
            if consumers_only_after_run and idle:
                stop_evt.set()  # consumers only (distributed): stop once idle after the run
            msg = _get(q, hard_deadline, procs, "finish")
            if msg is None:
                continue
            kind, role, index, payload = msg
            if kind == "failed":
                raise RuntimeError(f"{role} {index} failed:\n{payload}")
            if kind == "done":
                done[(role, index)] = payload
                if role == "producer" and all(("producer", j.index) in done for j in pjobs):
                    producers_done_s = time.time()
                    if not start_evt.is_set():  # the backlog was never reached: drain what there is
                        start_evt.set()
                        consumers_started_s = time.time()
            elif kind == "tick":
                second, n_all, n_measured, errors, hist = payload
                timeline.add(role, second, n_all, n_measured, errors, hist)
                totals[role] += n_all
                totals["errors"] += errors
                last_rates[f"{role}{index}"] = (time.time(), (n_all, hist))
                if role == "consumer" and n_all:
                    last_delivery = time.time()
                if (
                    not start_evt.is_set()
                    and case.consumers_start_after_msgs
                    and totals["producer"] >= case.consumers_start_after_msgs
                ):
                    start_evt.set()
                    consumers_started_s = time.time()
                if time.monotonic() - shown >= 0.5:
                    shown = time.monotonic()
                    _show(bar, case, start, total_s, last_rates, totals)
            if producers_done_s is not None and cjobs and not stop_evt.is_set():
                expected = totals["producer"] * case.consumer_groups
                if totals["consumer"] >= expected or time.time() - producers_done_s > case.drain_timeout_s:
                    stop_evt.set()
        bar.done()
    finally:
        stop_evt.set()
        start_evt.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    return _case_result(case, pjobs, cjobs, done, timeline, start, consumers_started_s)


def broker_cost(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What a case cost the brokers between two samples (``broker_sample``): CPU seconds, and the
    publishes refused for a quota, off the frame and on the command path."""
    return {
        "cpu_s": round(after["cpu_s"] - before["cpu_s"], 3),
        "quota_early_refusals": after["quota_early_refusals"] - before["quota_early_refusals"],
        "quota_refusals": after["quota_refusals"] - before["quota_refusals"],
    }


def _get(q: Any, deadline: float, procs: list[Any], what: str) -> tuple[str, str, int, Any] | None:
    """The next report from a generator, or None after half a second without one; fails past
    ``deadline`` (monotonic) or when a generator process died without reporting."""
    try:
        msg: tuple[str, str, int, Any] = q.get(timeout=0.5)
        return msg
    except queue.Empty:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the generators did not {what} in time") from None
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"a generator process exited with code {dead[0].exitcode}") from None
        return None


def _show(bar: Any, case: Case, start: float, total_s: float, last: dict[str, Any], totals: dict[str, int]) -> None:
    if not bar.enabled:
        return
    pub = sum(n for k, (_t, (n, _h)) in last.items() if k.startswith("producer"))
    con = sum(n for k, (_t, (n, _h)) in last.items() if k.startswith("consumer"))
    send = merge(h for k, (_t, (_n, h)) in last.items() if k.startswith("producer"))
    e2e = merge(h for k, (_t, (_n, h)) in last.items() if k.startswith("consumer"))
    bar.update(
        progress_line.line(
            case=case.name,
            elapsed_s=time.time() - start,
            total_s=total_s,
            published_per_s=pub,
            consumed_per_s=con,
            send_p99_ms=send.get_value_at_percentile(99) / 1000 if send.get_total_count() else None,
            e2e_p99_ms=e2e.get_value_at_percentile(99) / 1000 if e2e.get_total_count() else None,
            errors=totals["errors"],
        )
    )


def _case_result(
    case: Case,
    pjobs: list[ProducerJob],
    cjobs: list[ConsumerJob],
    done: dict[tuple[str, int], dict[str, Any]],
    timeline: _Timeline,
    start: float,
    consumers_started: float | None,
) -> dict[str, Any]:
    prods = [done[("producer", j.index)] for j in pjobs]
    cons = [done[("consumer", j.index)] for j in cjobs]
    out: dict[str, Any] = {"status": "ok", "start_wall_s": start, "measure_from_wall_s": start + case.warmup_s}
    if prods:
        out["publish"] = publish_summary(prods, case)
    if cons:
        out["consume"] = consume_summary(cons, case, expected=sum(p["acked"] for p in prods) * case.consumer_groups)
    out["timeline"] = timeline.rows()
    if case.tenants is not None:
        out["tenants"] = {
            t: {"noisy": t == tenant_name(0), **publish_summary([p for p in prods if p["tenant"] == t], case)}
            for t in sorted({p["tenant"] for p in prods})
        }
        for t, summary in out["tenants"].items():  # each tenant's own consumers: its end-to-end latency
            mine = [c for c in cons if c.get("tenant") == t]
            if mine:
                summary["consume"] = consume_summary(mine, case, expected=summary["acked"] * case.consumer_groups)
    if ("burner", 0) in done:
        out["cpu_burner"] = done[("burner", 0)]
    if case.autoscale is not None:
        from loadtest.delivery import summary as delivery_summary

        out["delivery"] = delivery_summary((p["tally"] for p in prods), (c["tally"] for c in cons))
    if case.consumers_start_after_msgs and consumers_started is not None:
        out["backlog"] = backlog_summary(out["timeline"], consumers_started - start, case)
    return out


def publish_summary(prods: list[dict[str, Any]], case: Case) -> dict[str, Any]:
    hist = merge(p["hist"] for p in prods)
    lag = merge(p["lag_hist"] for p in prods)
    measured = sum(p["acked_measured"] for p in prods)
    kinds: dict[str, int] = {}
    for p in prods:
        for k, v in p["errors_by_kind"].items():
            kinds[k] = kinds.get(k, 0) + v
    avg_bytes = sum(case.message_bytes) / 2
    return {
        "acked": sum(p["acked"] for p in prods),
        "acked_measured": measured,
        "client_cpu_s": round(sum(p.get("cpu_s", 0.0) for p in prods), 3),  # the producer processes'
        "errors": sum(p["errors"] for p in prods),
        "errors_by_kind": kinds,
        "dropped_behind_schedule": sum(p["dropped"] for p in prods),
        "target_msgs_per_s": case.rate_msgs_per_s or None,
        "msgs_per_s": round(measured / case.duration_s, 1),
        "mb_per_s": round(measured * avg_bytes / case.duration_s / 1e6, 2),
        "send_latency_ms": summary_ms(hist),
        "send_latency_hist": encode_hist(hist),
        "generator_lag_ms": summary_ms(lag),
        "generator_lag_hist": encode_hist(lag),
    }


def consume_summary(cons: list[dict[str, Any]], case: Case, *, expected: int) -> dict[str, Any]:
    hist = merge(c["hist"] for c in cons)
    consumed = sum(c["consumed"] for c in cons)
    firsts = [c["first_wall_s"] for c in cons if c["consumed"]]
    span = max(c["last_wall_s"] for c in cons) - min(firsts) if firsts else 0.0
    per_group: dict[str, int] = {}
    for c in cons:
        for g, n in c["per_group"].items():
            per_group[g] = per_group.get(g, 0) + n
    return {
        "consumed": consumed,
        "expected": expected,
        "per_group": per_group,
        "msgs_per_s": round(consumed / span, 1) if span > 0 else 0.0,
        "e2e_latency_ms": summary_ms(hist),
        "e2e_latency_hist": encode_hist(hist),
        "out_of_order": sum(c["out_of_order"] for c in cons),
        "redelivered": sum(c["redelivered"] for c in cons),
    }


def backlog_summary(rows: list[dict[str, Any]], started_at_s: float, case: Case) -> dict[str, Any]:
    """Does publishing slow down while the backlog drains? The publish rate in the measured
    seconds (whole ones, past the warm-up) before the consumers started and in those after,
    until the producers' schedule ends. ``started_at_s`` counts from the run's start."""
    end_s = case.warmup_s + case.duration_s
    before = [r["published_msgs"] for r in rows if case.warmup_s <= r["t_s"] and r["t_s"] + 1 <= started_at_s]
    during = [r["published_msgs"] for r in rows if started_at_s + 1 <= r["t_s"] and r["t_s"] + 1 <= end_s]
    published = consumed = 0
    caught_up_at_s = None
    for r in rows:
        published += r["published_msgs"]
        consumed += r["consumed_msgs"]
        caught_up = published and consumed >= published * case.consumer_groups
        if caught_up_at_s is None and r["t_s"] >= started_at_s and caught_up:
            caught_up_at_s = r["t_s"] + 1
    return {
        "consumers_started_at_s": round(started_at_s, 2),
        "publish_msgs_per_s_before": _mean(before),
        "publish_msgs_per_s_while_draining": _mean(during),
        "consumers_caught_up_at_s": caught_up_at_s,  # end of the first second they had read all published
    }


def _mean(xs: list[int]) -> float | None:
    return round(sum(xs) / len(xs), 1) if xs else None


def run(scenario: Scenario, opts: RunOptions, *, log: Callable[[str], None]) -> dict[str, Any]:
    """Every case of ``scenario`` on Orbit and on its peers; the result document (not yet with
    machine limits or ratios — ``report.finish`` adds those)."""
    root = opts.data_dir or tempfile.mkdtemp(prefix="orbit-loadtest-")
    own = opts.data_dir is None
    cases_out: list[dict[str, Any]] = []
    try:
        for case in scenario.cases:
            if opts.only_cases and case.name not in opts.only_cases:
                continue
            targets = ["orbit", *(scenario.peers if opts.run_peers and opts.remote is None else ())]
            for target in targets:
                where = os.path.join(root, f"{case.name}-{target}")
                shutil.rmtree(where, ignore_errors=True)
                server: Server
                if target != "orbit":
                    server = peer_server(target, where)
                elif opts.remote is not None:
                    server = RemoteOrbit(opts.remote, create_topics=opts.create_topics)
                else:
                    server = OrbitServer(where, case)
                log(f"case {case.name} on {target}")
                cases_out.append(run_case(case, server, target=target, opts=opts, log=log))
                shutil.rmtree(where, ignore_errors=True)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "scenario": {"name": scenario.name, "description": scenario.description, "source": scenario.source},
        "seed": opts.seed,
        "cases": cases_out,
    }
    if scenario.peers:
        doc["peers_unavailable"] = {"kafka": KAFKA_NOTE}
    return doc
