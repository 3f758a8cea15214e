"""``orbit bench e2e``: end-to-end figures of one broker over loopback, printed as JSON.

A fresh LocalCluster (name server + one broker process, ASYNC_FLUSH) under a temporary
directory; producers and consumers are processes of their own using the SDK; 1 KiB messages.
Phases, in order:

1. ``publish_batched``: producer processes, each with several batches of 32 in flight —
   published-and-acknowledged messages per second;
2. ``publish_sync_16``: 16 producers (tasks in ``sync_processes`` processes, one by default),
   each sending one message and awaiting its acknowledgement before the next — messages per
   second and send latency. A process's tasks share its client and connection, as the threads
   of RocketMQ's own benchmark producer share one producer; the broker answers their pipelined
   requests in slices (``answer_slice``), so the process works on the first answers while the
   broker handles the rest (docs/broker.md compares one to four processes);
3. ``consume``: consumer processes (one push-consumer group) drain what phases 1-2 stored:
   consumed messages per second, from the first message received to the last;
4. ``half_peak``: one open-loop publisher process at half of phase 2's rate — send latency
   measured from each message's *intended* send time (so a stall is not hidden by coordinated
   omission). It wakes every ``TICK_US`` (500 µs) on a timerfd (``loadtest.ticker``) and sends
   what has come due with ``send_async`` (no task a message), sleeping in between rather than
   spinning the core the broker shares; where timerfd is missing it spins the loop. Like the
   closed-loop phases it runs ``warmup_s`` before its measured ``seconds``; the warm-up's sends
   (the first writes to a fresh topic, whose queue files are made then) are reported apart, as
   ``warmup_send_latency_ms``. Then ``half_peak.with_consumer``: the same with a push consumer
   reading the topic — send latency again, and end-to-end latency (stored in a property at the
   intended send time, read at delivery).

Before the cluster starts, 4 x ``warm_memory_mb`` of page cache is written and freed (reported
as ``machine.page_cache_write_before``): on a VM that hands freed memory back to its host, the
phases then reuse memory that is backed, as a broker that has run for a while does, instead of
taking a host fault a page (docs/broker.md, "Cold memory").

``--latency-first`` runs the synchronous and half-peak phases first, on a fresh broker, then
the batched and consume ones: after the batched phase's 4-5 GB the same open-loop phase's p99
was several times higher on a 2-core virtual machine, for a cause not established — not a write-back
backlog, which is gone by then (docs/broker.md, "Stalls of the broker's event loop").

Latencies are HdrHistograms (1 µs .. 60 s, 3 significant digits), merged over processes; a
worker keeps them as plain numbers while its phase runs — in an array the garbage collector
never walks (``latency_log``) — and fills the histogram afterwards (``hist_of``: recording costs
~2.2 µs in pure Python, ten times an append).
Each worker process freezes what it holds once its client is started (``gc.freeze``), as a
latency-minded application would: its garbage collector then never walks the modules and
set-up objects again (a full collection of them took 30-50 ms on the 2-core VM, a stall the
send latencies would otherwise show; the collector stays on for everything made after).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.machine import page_cache_write, python_loop_ns
from data_plane.interpreter import interpreter_facts
from data_plane.local_cluster import LocalCluster
from loadtest import grpc_e2e
from loadtest.cpu import CpuWindow, us_per_msg
from loadtest.histogram import encode_hist, hist_of, latency_log, merge, summary_ms
from loadtest.rate import OpenLoop, RateProfile
from loadtest.ticker import Ticker
from loadtest.verdict import targets, verdict

GRPC_TOPICS = ("bench-grpc", "bench-grpc-unary", "bench-grpc-lat")

# The open-loop publisher's beat: every TICK_US it sends what has come due (~15 messages at
# 30,000/s), sleeping in between instead of spinning a core the broker needs. 500 µs against
# 100 µs: the same p99 at 30,000/s, a third less of the publisher's CPU (docs/broker.md).
TICK_US = 500
TLS_RATIO_TARGET = 0.7  # TLS throughput against plain, each phase


@dataclass(frozen=True, slots=True, kw_only=True)
class E2EOptions:
    seconds: float = 10.0  # each publishing phase
    message_bytes: int = 1024
    batch: int = 32
    producer_processes: int = 2
    batches_in_flight: int = 8  # per producer process
    sync_producers: int = 16
    sync_processes: int = 1  # the synchronous producers' processes
    consumer_processes: int = 2
    # Messages a push consumer asks for in one pull (its pull_batch_size; RocketMQ's default,
    # and the SDK's, is 32). The broker returns at most 256 KiB of records a pull.
    pull_batch_size: int = 128
    queues: int = 8
    warmup_s: float = 1.0
    directory: str | None = None
    # The phases' order: batched, synchronous, consume, half-peak; ``latency_first``: synchronous
    # and half-peak on a fresh broker, then batched and consume (docs/broker.md).
    latency_first: bool = False
    # Before the cluster starts, write and free 4x this many MiB of page cache (0: not): on a VM
    # that hands freed memory back to its host, the first run after an idle spell otherwise
    # pays a host fault for each new page the phases use (docs/broker.md, "Cold memory").
    warm_memory_mb: int = 1024
    # Every client connection over TLS (the broker and name server in permissive mode, with a local
    # CA's certificate; clients verify it): what TLS costs, beside a plain run (``compare_tls``).
    tls: bool = False
    # The broker's RocketMQ 5 gRPC endpoint measured after the remoting phases (loadtest/grpc_e2e.py).
    grpc: bool = True

    @classmethod
    def quick(cls, directory: str | None = None) -> E2EOptions:
        return cls(seconds=3.0, warmup_s=0.5, directory=directory, warm_memory_mb=64)


# --- worker processes (module-level functions: they run in spawned interpreters) -------------------
def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _body(size: int) -> bytes:
    return (b"orbit-e2e-" * (size // 10 + 1))[:size]


async def _closed_loop(
    producer_group: str, namesrv: str, opts: dict[str, Any], lanes: int, send: Callable[[Any, bytes], Awaitable[int]]
) -> dict[str, Any]:
    """``lanes`` tasks, each calling ``send(producer, body)`` (which returns how many messages
    it published) and awaiting it before the next call, for warm-up + ``seconds``."""
    from sdk import Producer

    producer = Producer(producer_group, namesrv_addrs=[namesrv])
    await producer.start()
    gc.freeze()
    body = _body(opts["message_bytes"])
    lat_us = latency_log()  # into the histogram after the phase (hist_of)
    acked = errors = 0
    measure_from = time.perf_counter() + opts["warmup_s"]
    stop_at = measure_from + opts["seconds"]
    cpu = CpuWindow(opts.get("broker_pid"))

    async def cpu_window() -> None:  # the CPU of this process and the broker's while measuring
        await asyncio.sleep(measure_from - time.perf_counter())
        cpu.start()
        await asyncio.sleep(stop_at - time.perf_counter())
        cpu.stop()

    async def lane() -> None:
        nonlocal acked, errors
        while (t0 := time.perf_counter()) < stop_at:
            try:
                n = await send(producer, body)
            except Exception:
                errors += 1
                continue
            if t0 >= measure_from:
                acked += n
                lat_us.append(int((time.perf_counter() - t0) * 1e6))

    await asyncio.gather(cpu_window(), *(lane() for _ in range(lanes)))
    await producer.shutdown()
    return {
        "acked": acked,
        "errors": errors,
        "seconds": opts["seconds"],
        "hist": encode_hist(hist_of(lat_us)),
        "cpu_s": cpu.own_s,
        "broker_cpu_s": cpu.other_s,
    }


async def _publish_batched(namesrv: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    from sdk import Message

    async def send(producer: Any, body: bytes) -> int:
        await producer.send_batch([Message(topic, body, tags="bench") for _ in range(opts["batch"])])
        return int(opts["batch"])

    return await _closed_loop("bench-batched", namesrv, opts, opts["batches_in_flight"], send)


async def _publish_sync(namesrv: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    from sdk import Message

    async def send(producer: Any, body: bytes) -> int:
        await producer.send(Message(topic, body, tags="bench"))
        return 1

    return await _closed_loop("bench-sync", namesrv, opts, opts["tasks"], send)


async def _publish_open_loop(namesrv: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Sends at ``rate`` for ``warmup_s`` + ``seconds``, each at its intended time. Latencies
    of sends meant for the warm-up go to a histogram of their own (``warmup_hist``), as the
    closed-loop phases leave their first ``warmup_s`` out; only measured sends carry the
    ``bench_t_ns`` property that the end-to-end consumer times."""
    from sdk import Message, Producer

    producer = Producer("bench-open-loop", namesrv_addrs=[namesrv])
    await producer.start()
    gc.freeze()
    body = _body(opts["message_bytes"])
    lat_us = latency_log()
    warm_us = latency_log()
    rate = opts["rate"]
    sent = acked = errors = dropped = 0
    outstanding = 0
    max_outstanding = 20_000
    done = asyncio.Event()
    start = time.perf_counter() + 0.2
    warmup_s = opts.get("warmup_s", 0.0)
    measure_from = start + warmup_s
    profile = RateProfile.steady(msgs_per_s=rate, duration_s=warmup_s + opts["seconds"])
    n_total = profile.count()
    wall_minus_perf_ns = time.time_ns() - int(time.perf_counter() * 1e9)
    # The CPU of this process and the broker's over the measured sends' schedule: near a core
    # for this process means the generator, not the broker, sets the latency (docs/broker.md).
    cpu = CpuWindow(opts.get("broker_pid"))

    def answered(intended: float, measured: bool, fut: asyncio.Future[Any]) -> None:
        nonlocal acked, errors, outstanding
        if fut.cancelled() or fut.exception() is not None:
            errors += 1
        else:
            acked += 1
            (lat_us if measured else warm_us).append(int((time.perf_counter() - intended) * 1e6))
        outstanding -= 1
        if outstanding == 0 and sent + dropped >= n_total:
            done.set()

    schedule = OpenLoop(profile, start_s=start)
    # How late the generator itself sent (the oldest due send of a wake-up, against its intended
    # time; measured sends only): a send latency the broker did not cause starts here.
    late_max = 0.0
    late_over_5ms = 0

    def send_due() -> None:
        # send_async: the request is written now and the answer comes to a callback, no task
        # a message (the generator's own cost per message is what limits its rate)
        nonlocal outstanding, sent, dropped, errors, late_max, late_over_5ms
        now = time.perf_counter()
        due = schedule.due(now)
        if due and due[0] >= measure_from:
            late = now - due[0]
            late_max = max(late_max, late)
            late_over_5ms += late > 0.005
        for intended in due:
            if outstanding >= max_outstanding:
                dropped += 1  # counted: the broker fell this far behind the schedule
                continue
            sent += 1
            measured = intended >= measure_from
            props = {"bench_t_ns": str(wall_minus_perf_ns + int(intended * 1e9))} if measured else None
            try:
                producer.send_async(
                    Message(topic, body, tags="bench", properties=props),
                    callback=functools.partial(answered, intended, measured),
                )
            except Exception:  # refused before any request (the producer closed under us)
                errors += 1
                continue
            outstanding += 1

    loop = asyncio.get_running_loop()
    loop.call_later(max(0.0, measure_from - time.perf_counter()), cpu.start)
    loop.call_later(max(0.0, start + warmup_s + opts["seconds"] - time.perf_counter()), cpu.stop)
    tick_s = opts.get("tick_us", TICK_US) / 1e6
    ticker = None
    if tick_s > 0:
        scheduled = asyncio.Event()

        def on_tick() -> None:
            send_due()
            if schedule.next_at() is None:
                scheduled.set()

        ticker = Ticker.create(loop, tick_s, on_tick)
    if ticker is not None:
        try:
            await scheduled.wait()
        finally:
            ticker.close()
    else:  # no timerfd (or tick_us = 0): spin the loop up to each intended time
        while (next_at := schedule.next_at()) is not None:
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            send_due()
    if outstanding:
        await asyncio.wait_for(done.wait(), 60)
    await producer.shutdown()
    return {
        "acked": acked,
        "errors": errors,
        "dropped": dropped,
        "rate": rate,
        "hist": encode_hist(hist_of(lat_us)),
        "warmup_hist": encode_hist(hist_of(warm_us)),
        "seconds": opts["seconds"],
        "cpu_s": cpu.own_s,
        "broker_cpu_s": cpu.other_s,
        "cpu_msgs": len(lat_us),  # the measured sends answered
        "late_max_ms": round(late_max * 1000, 3),
        "wakeups_late_over_5ms": late_over_5ms,
    }


async def _consume(namesrv: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    from sdk import ConsumeResult, PushConsumer

    consumer = PushConsumer(
        opts["group"],
        namesrv_addrs=[namesrv],
        consume_from="FIRST_OFFSET",
        consume_batch_size=32,
        pull_batch_size=opts.get("pull_batch_size", 32),
    )
    consumer.subscribe(topic, "*")
    lat_us = latency_log()
    count = 0
    first = last = 0.0
    measure_e2e = opts.get("e2e", False)

    async def listener(msgs: list[Any]) -> Any:
        nonlocal count, first, last
        now = time.perf_counter()
        if not count:
            first = now
        last = now
        count += len(msgs)
        if measure_e2e:
            now_ns = time.time_ns()
            for m in msgs:
                t = m.properties.get("bench_t_ns")
                if t:
                    lat_us.append((now_ns - int(t)) // 1000)
        return ConsumeResult.SUCCESS

    consumer.on_message(listener)
    await consumer.start()
    gc.freeze()
    deadline = time.perf_counter() + opts["timeout_s"]
    idle_s = opts["idle_s"]
    # CPU from the first look that sees messages to the last look that sees more: a twentieth
    # of a second's grain at either end, against a phase of seconds.
    cpu = CpuWindow(opts.get("broker_pid"))
    cpu_from = cpu_to = seen = 0
    while time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
        if count != seen:
            if not seen:
                cpu.start()
                cpu_from = count
            else:
                cpu.stop()
                cpu_to = count
            seen = count
        if count and time.perf_counter() - last > idle_s:
            break
        if opts.get("expected") and count >= opts["expected"]:
            break
    await consumer.shutdown()
    return {
        "consumed": count,
        "first": first,
        "last": last,
        "hist": encode_hist(hist_of(lat_us)),
        "cpu_msgs": max(0, cpu_to - cpu_from),
        "cpu_s": cpu.own_s,
        "broker_cpu_s": cpu.other_s,
    }


def worker(kind: str, namesrv: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    fn = {
        "batched": _publish_batched,
        "sync": _publish_sync,
        "open_loop": _publish_open_loop,
        "consume": _consume,
    }[kind]
    result: dict[str, Any] = _run(fn(namesrv, topic, opts))
    return result


# --- the run --------------------------------------------------------------------------------------
def _pool_run(jobs: list[tuple[str, str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(len(jobs)) as pool:
        return pool.starmap(worker, jobs)


def _phase_batched(ns: str, base: dict[str, Any], opts: E2EOptions) -> dict[str, Any]:
    rs = _pool_run(
        [
            ("batched", ns, "bench", {**base, "batch": opts.batch, "batches_in_flight": opts.batches_in_flight})
            for _ in range(opts.producer_processes)
        ]
    )
    acked = sum(r["acked"] for r in rs)
    return {
        "msgs_per_s": round(acked / opts.seconds),
        "mb_per_s": round(acked * opts.message_bytes / opts.seconds / 1e6, 1),
        "batch": opts.batch,
        "errors": sum(r["errors"] for r in rs),
        "batch_latency_ms": summary_ms(merge([r["hist"] for r in rs])),
        "cpu_us_per_msg": _cpu_figures(rs, acked, "producers"),
    }


def _phase_sync(ns: str, base: dict[str, Any], opts: E2EOptions) -> dict[str, Any]:
    n_procs = max(1, min(opts.sync_processes, opts.sync_producers))
    per = [opts.sync_producers // n_procs + (i < opts.sync_producers % n_procs) for i in range(n_procs)]
    rs = _pool_run([("sync", ns, "bench", {**base, "tasks": n}) for n in per if n])
    acked = sum(r["acked"] for r in rs)
    return {
        "msgs_per_s": round(acked / opts.seconds),
        "processes": len(per),
        "errors": sum(r["errors"] for r in rs),
        "send_latency_ms": summary_ms(merge([r["hist"] for r in rs])),
        "cpu_us_per_msg": _cpu_figures(rs, acked, "producers"),
    }


def _phase_consume(ns: str, base: dict[str, Any], opts: E2EOptions, stored: int) -> dict[str, Any]:
    consume = {
        "group": "bench-consume",
        "timeout_s": 300,
        "idle_s": 3.0,
        "expected": 0,
        "pull_batch_size": opts.pull_batch_size,
        "broker_pid": base["broker_pid"],
    }
    rs = _pool_run([("consume", ns, "bench", consume) for _ in range(opts.consumer_processes)])
    consumed = sum(r["consumed"] for r in rs)
    span = max(r["last"] for r in rs) - min(r["first"] for r in rs if r["consumed"]) if consumed else 0
    return {
        "msgs_per_s": round(consumed / span) if span > 0 else 0,
        "consumed": consumed,
        "stored": stored,
        "cpu_us_per_msg": _cpu_figures(rs, sum(r["cpu_msgs"] for r in rs), "consumers"),
    }


def _phase_half_peak(
    ns: str, base: dict[str, Any], opts: E2EOptions, rate: float, log: Callable[[str], None]
) -> dict[str, Any]:
    before = _broker_runtime(ns)
    (alone,) = _pool_run([("open_loop", ns, "bench-lat", {**base, "rate": rate})])
    stalls = _loop_stalls(before, _broker_runtime(ns))
    log("  the same, with a push consumer reading the topic")
    e2e_consumer = {
        "group": "bench-lat",
        "timeout_s": opts.seconds + 60,
        "idle_s": 3.0,
        "expected": int(rate * (opts.warmup_s + opts.seconds)),
        "e2e": True,
        "pull_batch_size": opts.pull_batch_size,
        "broker_pid": base["broker_pid"],
    }
    rs = _pool_run([("open_loop", ns, "bench-e2e", {**base, "rate": rate}), ("consume", ns, "bench-e2e", e2e_consumer)])
    return {
        "target_msgs_per_s": round(rate),
        "acked": alone["acked"],
        "dropped_behind_schedule": alone["dropped"],
        "errors": alone["errors"],
        "send_latency_ms": summary_ms(merge([alone["hist"]])),
        "warmup_s": opts.warmup_s,
        "warmup_send_latency_ms": summary_ms(merge([alone["warmup_hist"]])),
        # CPU µs a message while measuring, and the share of a core each process used: the
        # open-loop publisher is one process, so a share near 1 is the generator's limit.
        "cpu_us_per_msg": _cpu_figures([alone], alone["cpu_msgs"], "publisher"),
        "cpu_core_share": _core_shares(alone),
        # The broker's event-loop stalls of 50 ms or more while the phase ran (stall_watch.py;
        # the broker's log has each one's stacks).
        "broker_loop_stalls": stalls,
        # How late the publisher's own wake-ups sent what was due (a process the hypervisor or the
        # other process kept off a core shows here, not in the broker's stalls).
        "publisher_lateness": {"max_ms": alone["late_max_ms"], "wakeups_over_5ms": alone["wakeups_late_over_5ms"]},
        "with_consumer": {
            "acked": rs[0]["acked"],
            "errors": rs[0]["errors"],
            "dropped_behind_schedule": rs[0]["dropped"],
            "send_latency_ms": summary_ms(merge([rs[0]["hist"]])),
            "warmup_send_latency_ms": summary_ms(merge([rs[0]["warmup_hist"]])),
            "e2e_latency_ms": summary_ms(merge([rs[1]["hist"]]), (50, 99)),
            "consumed": rs[1]["consumed"],
        },
    }


class BenchDirectoryError(ValueError):
    """The directory given for the cluster holds something already (the benchmark needs a fresh
    cluster, not one recovering an earlier run's store)."""


def run(opts: E2EOptions, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    if (
        opts.directory
        and os.path.exists(opts.directory)
        and (not os.path.isdir(opts.directory) or os.listdir(opts.directory))
    ):
        raise BenchDirectoryError(
            f"{opts.directory} is not an empty directory: the benchmark runs a fresh cluster there"
        )
    root = opts.directory or tempfile.mkdtemp(prefix="orbit-e2e-")
    own_dir = opts.directory is None
    base = {"message_bytes": opts.message_bytes, "seconds": opts.seconds, "warmup_s": opts.warmup_s}
    result: dict[str, Any] = {"options": asdict(opts), "machine": {"cpus": os.cpu_count(), **interpreter_facts()}}
    try:
        if opts.warm_memory_mb > 0:
            log(f"warming memory: {4 * opts.warm_memory_mb} MiB of page cache written and freed")
            # how fast new memory came before the phases (slow: the machine's was cold); the phases
            # then reuse what this freed
            os.makedirs(root, exist_ok=True)
            result["machine"]["page_cache_write_before"] = page_cache_write(root, opts.warm_memory_mb)
        with LocalCluster(root, namesrv_port=0, broker_port=0, tls=opts.tls) as cluster:
            ns = cluster.namesrv
            base["broker_pid"] = next(c.proc.pid for c in cluster.children if c.name.startswith("broker"))
            _create_topics(ns, ["bench", "bench-lat", "bench-e2e", *GRPC_TOPICS], opts.queues)

            def batched() -> None:
                log("batched publish")
                result["publish_batched"] = _phase_batched(ns, base, opts)
                log(f"  {result['publish_batched']}")

            def sync() -> None:
                log("16 synchronous producers")
                result["publish_sync_16"] = _phase_sync(ns, base, opts)
                log(f"  {result['publish_sync_16']}")

            def half_peak() -> None:
                rate = max(100.0, result["publish_sync_16"]["msgs_per_s"] / 2)
                log(f"open-loop publish at {rate:.0f} msgs/s (half the synchronous peak), alone")
                result["half_peak"] = _phase_half_peak(ns, base, opts, rate, log)
                log(f"  {result['half_peak']}")

            def consume() -> None:
                stored = _stored_messages(ns, "bench")
                log(f"consume the {stored} stored messages")
                result["consume"] = _phase_consume(ns, base, opts, stored)
                log(f"  {result['consume']}")

            phases = (sync, half_peak, batched, consume) if opts.latency_first else (batched, sync, consume, half_peak)
            for n, phase in enumerate(phases, 1):
                log(f"phase {n}:")
                phase()
            grpc_endpoint = cluster.endpoints().get("grpc")
            if opts.grpc and grpc_endpoint and not opts.tls:
                grpc_e2e.run_phases(grpc_endpoint, base, opts.queues, result, log)
        # What the machine gave this hour (its speed drifts 2-3x between hours): measured after the phases, so
        # that the probe's page-cache writes do not change what the broker finds.
        result["machine"]["python_loop_ns"] = python_loop_ns()
        result["machine"]["page_cache_write"] = page_cache_write(root, 64)
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
    result["targets"] = targets(result)
    result["met"] = verdict(result)
    return result


TLS_PHASES = ("publish_batched", "publish_sync_16", "consume")


def compare_tls(opts: E2EOptions, log: Callable[[str], None] = lambda m: None, *, pairs: int = 1) -> dict[str, Any]:
    """``pairs`` times the same run plain and over TLS, one after the other on fresh clusters
    (the order alternating, so that neither side always runs first on a cold machine), with each
    throughput's TLS/plain ratio a pair and their median (``tls_vs_plain``; target 0.7 or more)."""
    runs: list[dict[str, Any]] = []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got: dict[bool, dict[str, Any]] = {}
        for tls in order:
            log(f"pair {i + 1} of {pairs}: {'TLS' if tls else 'plain'}")
            got[tls] = run(dataclasses.replace(opts, tls=tls, directory=None), log)
        ratios: dict[str, float | None] = {}
        for phase in TLS_PHASES:
            a = (got[False].get(phase) or {}).get("msgs_per_s")
            b = (got[True].get(phase) or {}).get("msgs_per_s")
            ratios[phase] = round(b / a, 3) if a and b is not None else None
        runs.append({"plain": got[False], "tls": got[True], "tls_vs_plain": ratios})
    median: dict[str, float | None] = {}
    for phase in TLS_PHASES:
        values = [r for p in runs if (r := p["tls_vs_plain"][phase]) is not None]
        median[phase] = round(statistics.median(values), 3) if values else None
    return {
        "pairs": runs,
        "tls_vs_plain": median,
        "tls_target": TLS_RATIO_TARGET,
        "tls_met": all(r is not None and r >= TLS_RATIO_TARGET for r in median.values()),
    }


def _cpu_figures(rs: list[dict[str, Any]], msgs: int, clients: str) -> dict[str, float | None]:
    """CPU µs a message of the broker and of the client processes, over the workers' measuring
    windows (which all but coincide: the broker's is the mean of what each worker saw)."""
    own = [r["cpu_s"] for r in rs if r.get("cpu_s") is not None]
    broker = [r["broker_cpu_s"] for r in rs if r.get("broker_cpu_s") is not None]
    return {
        "broker": us_per_msg(sum(broker) / len(broker) if broker else None, msgs),
        clients: us_per_msg(sum(own) if own else None, msgs),
    }


def _core_shares(r: dict[str, Any]) -> dict[str, float | None]:
    """The share of one core the publisher and the broker used over a worker's window."""
    seconds = r["seconds"]

    def share(cpu_s: float | None) -> float | None:
        return round(cpu_s / seconds, 2) if cpu_s is not None and seconds > 0 else None

    return {"publisher": share(r.get("cpu_s")), "broker": share(r.get("broker_cpu_s"))}


def _create_topics(namesrv: str, topics: list[str], queues: int) -> None:
    from sdk.admin import AdminClient

    async def go() -> None:
        async with AdminClient([namesrv]) as admin:
            for t in topics:
                await admin.create_topic(t, queue_nums=queues)

    asyncio.run(go())


def _broker_runtime(namesrv: str) -> dict[str, str]:
    """The (one) broker's runtime figures."""
    from sdk.admin import AdminClient

    async def go() -> dict[str, str]:
        async with AdminClient([namesrv]) as admin:
            rows = await admin.cluster_status()
        return next((r["status"] for r in rows if r.get("status")), {})

    return asyncio.run(go())


def _loop_stalls(before: dict[str, str], after: dict[str, str]) -> dict[str, Any]:
    """The broker's loop stalls between two runtime readings: how many, and the last one's
    length and innermost frame when there were any."""
    n = int(after.get("loopStalls", 0)) - int(before.get("loopStalls", 0))
    out: dict[str, Any] = {"count": n}
    if n > 0:
        out["last_ms"] = int(after.get("lastLoopStallMs", 0))
        out["last_at"] = after.get("lastLoopStallAt", "")
    return out


def _stored_messages(namesrv: str, topic: str) -> int:
    from sdk.admin import AdminClient

    async def go() -> int:
        async with AdminClient([namesrv]) as admin:
            return sum(q.max_offset - q.min_offset for q in await admin.describe_topic(topic))

    return asyncio.run(go())
