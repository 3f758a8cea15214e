"""Generator processes: producers and consumers, each a process of its own (spawned, so the
load uses every core and no generator shares an interpreter lock with another).

Every generated body starts with ``HEADER``; consumers read it back, which gives end-to-end
latency (delivery time minus the *intended* send time) and, for ordered cases, a per-key order
check — the same way for Orbit and for peers, without relying on message properties::

    0        8         12    16        24
    +--------+---------+-----+---------+----------------- ... padding to the message size
    | t_ns   | producer| key | seq     |
    +--------+---------+-----+---------+
    t_ns: intended send time, ns since the epoch (big-endian int64)

Workers report to the parent through one queue: a ``tick`` a second (counts and an interval
latency histogram, for the progress line and the time series) and one ``done`` (totals and the
whole-run histogram) — or ``failed`` with the traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import struct
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadtest import cpu_split
from loadtest.delivery import Tally
from loadtest.histogram import encode_hist, new_hist, record_us
from loadtest.rate import OpenLoop, RateProfile, Segment
from loadtest.targets import publisher, subscriber

HEADER = struct.Struct(">qIIQ")
assert HEADER.size == 24
MAX_OUTSTANDING = 20_000  # open loop: sends in flight per process before later ones count as dropped
MIN_WAKE_S = 0.001  # open loop: the shortest sleep of a generator sending faster than one send per this
TICK_S = 1.0  # the timeline's resolution
DRAIN_S = 60.0  # open loop: how long to wait for sends still in flight at the end


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerJob:
    index: int
    tenant: str | None
    spec: dict[str, Any]
    topics: list[str]
    message_bytes: tuple[int, int]
    batch: int
    connections: int
    in_flight: int
    ordered: bool
    keys: int
    segments: tuple[tuple[float, float, float], ...]  # open loop: (start_s, end_s, sends_per_s); () = closed loop
    warmup_s: float
    duration_s: float
    seed: int
    nice: int = 0  # added to the process's niceness before it starts
    track: bool = False  # keep the acknowledged messages' numbers (loadtest/delivery.py)
    cpus: tuple[int, ...] = ()  # the CPUs it runs on (loadtest/cpu_split.py); (): where it was started


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerJob:
    index: int
    tenant: str | None
    spec: dict[str, Any]
    groups: list[str]
    topics: list[str]
    ordered: bool
    warmup_s: float
    track: bool = False  # keep the delivered messages' numbers (loadtest/delivery.py)
    cpus: tuple[int, ...] = ()  # the CPUs it runs on (loadtest/cpu_split.py); (): where it was started


@dataclass
class _Interval:
    n_all: int = 0
    n_measured: int = 0
    errors: int = 0
    hist: Any = field(default_factory=new_hist)


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _ticker(role: str, index: int, q: Any, interval: _Interval, start_s: float, stop: asyncio.Event) -> None:
    """At each whole second k after the run's start: the counts and latencies of second k-1
    (``[start + k-1, start + k)``), so every generator's ticks fall into the same bins."""
    k = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start_s + (k + 1) * TICK_S - time.time()))
        payload = (k, interval.n_all, interval.n_measured, interval.errors, encode_hist(interval.hist))
        q.put(("tick", role, index, payload))
        interval.n_all = interval.n_measured = interval.errors = 0
        interval.hist = new_hist()
        k += 1


async def _await_start(start_wall: Any) -> float:
    """The run's start (wall clock, s), once the parent has set it — after every generator
    reported ready, so slow process start-up is not part of the measured load."""
    await _poll(lambda: start_wall.value > 0)
    return float(start_wall.value)


def burner_main(nice: int, q: Any, start_wall: Any, seconds: float, stop: Any, cpus: tuple[int, ...] = ()) -> None:
    """A process that only spins, at ``nice`` (on ``cpus``: tenant 0's), from the run's start for
    ``seconds``: a control case's stand-in for a busy client of tenant 0 on this machine that sends
    nothing extra — what a co-located process's CPU alone costs the others. Gives up when ``stop``
    is set first."""
    try:
        cpu_split.pin(cpus)
        os.nice(nice)
        q.put(("ready", "burner", 0, None))
        while start_wall.value <= 0:
            if stop.wait(0.01):
                return
        start = float(start_wall.value)
        time.sleep(max(0.0, start - time.time()))
        cpu_from = time.process_time()
        end = start + seconds
        look = 0.0
        while (now := time.time()) < end:
            sum(range(1000))  # (spins: no sleep, no I/O)
            if now >= look:  # the event's lock is shared with the other generators: seldom, not every turn
                if stop.is_set():
                    break
                look = now + 0.1
        q.put(("done", "burner", 0, {"cpu_s": round(time.process_time() - cpu_from, 3)}))
    except BaseException:
        q.put(("failed", "burner", 0, traceback.format_exc()))


async def _poll(cond: Callable[[], bool], every_s: float = 0.02) -> None:
    """Wait for a flag another process sets (a multiprocessing Value or Event cannot be awaited)."""
    while True:
        if cond():
            return
        await asyncio.sleep(every_s)


def producer_main(job: ProducerJob, q: Any, start_wall: Any) -> None:
    try:
        cpu_split.pin(job.cpus)
        if job.nice:
            os.nice(job.nice)
        q.put(("done", "producer", job.index, _run(_produce(job, q, start_wall))))
    except BaseException:
        q.put(("failed", "producer", job.index, traceback.format_exc()))


async def _produce(job: ProducerJob, q: Any, start_wall: Any) -> dict[str, Any]:
    clients = [publisher(job.spec, instance=f"lt-p{job.index}-c{i}") for i in range(job.connections)]
    for c in clients:
        await c.start()
    q.put(("ready", "producer", job.index, None))
    start_s = await _await_start(start_wall)
    cpu_from = time.process_time()
    measure_from_s = start_s + job.warmup_s
    stop_s = measure_from_s + job.duration_s
    rng = random.Random(job.seed)
    lo, hi = job.message_bytes
    pad = bytes(rng.randrange(256) for _ in range(hi))
    seqs = [0] * job.keys
    counter = 0
    whole = new_hist()
    # How late the generator itself starts each send (actual start - intended time): when this
    # grows, the load generator is the bottleneck, not the server.
    lag = new_hist()
    interval = _Interval()
    totals = {"acked": 0, "acked_measured": 0, "errors": 0, "dropped": 0, "sends": 0}
    errors_by_kind: dict[str, int] = {}
    tally = Tally() if job.track else None

    # Ordered: one send at a time per key, in sequence order (asyncio.Lock wakes waiters first in,
    # first out) — concurrent sends of one key could reach the broker in any order.
    key_locks = [asyncio.Lock() for _ in range(job.keys)] if job.ordered else []

    def bodies(intended_s: float) -> tuple[str, list[bytes], int]:
        nonlocal counter
        t_ns = int(intended_s * 1e9)
        out = []
        k = counter % job.keys if job.ordered else 0
        topic = job.topics[(k if job.ordered else counter) % len(job.topics)]
        for _ in range(job.batch):
            seqs[k] += 1
            size = lo if lo == hi else rng.randint(lo, hi)
            out.append(HEADER.pack(t_ns, job.index, k, seqs[k]) + pad[: size - HEADER.size])
            counter += 1
        return topic, out, k

    async def send_one(client: Any, intended_s: float) -> None:
        if intended_s >= measure_from_s:
            record_us(lag, (time.time() - intended_s) * 1e6)
        topic, msgs, k = bodies(intended_s)
        last_seq = seqs[k]
        try:
            if job.ordered:
                async with key_locks[k]:
                    await client.send(topic, msgs, f"p{job.index}-k{k}")
            else:
                await client.send(topic, msgs, None)
        except Exception as e:
            name = type(e).__name__
            errors_by_kind[name] = errors_by_kind.get(name, 0) + 1
            totals["errors"] += 1
            interval.errors += 1
            return
        done = time.time()
        n = len(msgs)
        if tally is not None:
            for seq in range(last_seq - n + 1, last_seq + 1):
                tally.add((job.index, k), seq)
        totals["acked"] += n
        interval.n_all += n
        if intended_s >= measure_from_s:
            totals["acked_measured"] += n
            interval.n_measured += n
            lat_us = (done - intended_s) * 1e6
            record_us(whole, lat_us)
            record_us(interval.hist, lat_us)

    stop_ticks = asyncio.Event()
    ticker = asyncio.create_task(_ticker("producer", job.index, q, interval, start_s, stop_ticks))
    await _sleep_until(start_s)
    if job.segments:
        await _open_loop(job, start_s, clients, send_one, totals)
    else:

        async def lane(i: int) -> None:
            client = clients[i % len(clients)]
            while (t0 := time.time()) < stop_s:
                totals["sends"] += 1
                await send_one(client, t0)

        await asyncio.gather(*(lane(i) for i in range(job.in_flight)))
    stop_ticks.set()
    await ticker
    for c in clients:
        await c.close()
    return {
        **totals,
        "cpu_s": round(time.process_time() - cpu_from, 3),  # the process's own, from the start to the last answer
        "errors_by_kind": errors_by_kind,
        "hist": encode_hist(whole),
        "lag_hist": encode_hist(lag),
        "tenant": job.tenant,
        "tally": tally.encode() if tally is not None else None,
    }


async def _open_loop(
    job: ProducerJob,
    start_s: float,
    clients: list[Any],
    send_one: Callable[[Any, float], Any],
    totals: dict[str, int],
) -> None:
    """Send on the schedule whatever happens; each send's latency counts from its intended
    time. Past MAX_OUTSTANDING sends in flight, later ones are dropped and counted. While its sends
    come closer than MIN_WAKE_S apart a generator wakes once every MIN_WAKE_S and sends what is
    due (uvloop's timers count whole milliseconds: a shorter sleep comes back at once and spins
    the loop); at slower rates it wakes for each send."""
    profile = RateProfile(tuple(Segment(*s) for s in job.segments))
    schedule = OpenLoop(profile, start_s=start_s)
    tasks: set[asyncio.Task[None]] = set()
    i = 0
    while (next_at := schedule.next_at()) is not None:
        now = time.time()
        if next_at > now:  # (sends closer than MIN_WAKE_S apart now: wake once a MIN_WAKE_S)
            fast = profile.rate_at(next_at - start_s) * MIN_WAKE_S > 1
            await asyncio.sleep(max(next_at - now, MIN_WAKE_S) if fast else next_at - now)
        for intended in schedule.due(time.time()):
            if len(tasks) >= MAX_OUTSTANDING:
                totals["dropped"] += job.batch
                continue
            totals["sends"] += 1
            task = asyncio.create_task(send_one(clients[i % len(clients)], intended))
            i += 1
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(set(tasks), timeout=DRAIN_S)


async def _sleep_until(wall_s: float) -> None:
    delay = wall_s - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


class OrderCheck:
    """Per-key order as one consumer process sees it. Each key's sequence numbers start at 1 and
    have no holes when sent; a message whose number is below the highest seen so far is either a
    redelivery (seen before: a rebalance or a retry) or out of order (a hole this process had
    skipped — it was delivered after a later message of its key). A key's first message here
    starts its count (earlier ones went to another consumer), and a hole wider than MAX_GAP is a
    hand-over of the queue between consumers, not tracked."""

    MAX_GAP = 100_000
    __slots__ = ("_missing", "_top", "out_of_order", "redelivered")

    def __init__(self) -> None:
        self._top: dict[tuple[str, int, int], int] = {}
        self._missing: dict[tuple[str, int, int], set[int]] = {}
        self.out_of_order = 0
        self.redelivered = 0

    def see(self, key: tuple[str, int, int], seq: int) -> None:
        top = self._top.get(key)
        if top is None or seq > top:
            if top is not None and 1 < seq - top <= self.MAX_GAP:
                self._missing.setdefault(key, set()).update(range(top + 1, seq))
            self._top[key] = seq
            return
        missing = self._missing.get(key)
        if missing and seq in missing:
            missing.discard(seq)
            self.out_of_order += 1
        else:
            self.redelivered += 1


def consumer_main(job: ConsumerJob, q: Any, start_wall: Any, start_evt: Any, stop_evt: Any) -> None:
    try:
        cpu_split.pin(job.cpus)
        q.put(("done", "consumer", job.index, _run(_consume(job, q, start_wall, start_evt, stop_evt))))
    except BaseException:
        q.put(("failed", "consumer", job.index, traceback.format_exc()))


async def _consume(job: ConsumerJob, q: Any, start_wall: Any, start_evt: Any, stop_evt: Any) -> dict[str, Any]:
    q.put(("ready", "consumer", job.index, None))
    measure_from_s = await _await_start(start_wall) + job.warmup_s
    await _poll(start_evt.is_set)  # backlog cases: the parent says when
    started = time.time()
    whole = new_hist()
    interval = _Interval()
    per_group: dict[str, int] = dict.fromkeys(job.groups, 0)
    order = OrderCheck()
    tally = Tally() if job.track else None
    first = last = 0.0
    measure_from_ns = int(measure_from_s * 1e9)

    def on_batch_for(group: str) -> Callable[[list[bytes]], None]:
        def on_batch(bodies: list[bytes]) -> None:
            nonlocal first, last
            now = time.time()
            now_ns = int(now * 1e9)
            if not first:
                first = now
            last = now
            per_group[group] += len(bodies)
            interval.n_all += len(bodies)
            for b in bodies:
                t_ns, producer, key, seq = HEADER.unpack_from(b)
                if t_ns >= measure_from_ns:
                    interval.n_measured += 1
                    lat_us = (now_ns - t_ns) / 1000
                    record_us(whole, lat_us)
                    record_us(interval.hist, lat_us)
                if job.ordered:
                    order.see((group, producer, key), seq)
                if tally is not None:
                    tally.add((producer, key), seq)
                    tally.deliveries += 1

        return on_batch

    stop = asyncio.Event()

    async def watch_stop() -> None:
        await _poll(stop_evt.is_set)
        stop.set()

    stop_ticks = asyncio.Event()
    ticker = asyncio.create_task(_ticker("consumer", job.index, q, interval, measure_from_s - job.warmup_s, stop_ticks))
    watcher = asyncio.create_task(watch_stop())
    subs = [subscriber(job.spec, group=g, topics=job.topics, ordered=job.ordered) for g in job.groups]
    await asyncio.gather(*(s.run(on_batch_for(g), stop) for s, g in zip(subs, job.groups, strict=True)))
    await watcher
    stop_ticks.set()
    await ticker
    return {
        "tenant": job.tenant,
        "consumed": sum(per_group.values()),
        "per_group": per_group,
        "started_wall_s": started,
        "first_wall_s": first,
        "last_wall_s": last,
        "hist": encode_hist(whole),
        "out_of_order": order.out_of_order,
        "redelivered": order.redelivered,
        "tally": tally.encode() if tally is not None else None,
    }
