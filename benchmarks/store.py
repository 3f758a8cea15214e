"""``orbit bench store``: the store's throughput and memory figures, printed as JSON.

Every figure comes from this run on this machine; each is the median of ``repeats`` runs
(3 by default; ``runs_msgs_per_s`` keeps them all — runs on a shared virtual machine vary a lot). Before
each timed run the dirty pages of earlier ones are written back (``os.sync``, not timed), so no
run pays for its predecessor's write-back:

* ``disk_seq_write``: raw sequential write bandwidth of the disk holding the store directory
  (1 MiB ``write`` calls, then ``fdatasync``), the yardstick for the rest;
* ``page_cache_write``: four times as many such writes without the ``fdatasync`` (whole, and the
  last quarter) -- how fast this machine puts new bytes into new page-cache memory, the ceiling
  of an ASYNC_FLUSH append while the page cache grows (the appends below reuse freed pages).
  On a VM whose balloon hands freed memory back to the host (free page reporting), a page
  the guest has not used lately costs a host fault, and the rate falls from
  GiB/s to a few hundred MiB/s once recently freed memory is used up;
* ``machine.python_loop_ns``: how long a simple CPython loop iteration takes (best of three),
  the other speed a virtual machine varies on;
* ``append_single`` / ``append_batch32``: 1 KiB messages with TAGS and UNIQ_KEY properties (what
  a stock RocketMQ producer sends), ASYNC_FLUSH, in-process, ConsumeQueue and index included;
  before each run the CommitLog written so far also leaves the page cache, so the run appends
  into memory the machine backs, freed a moment before: a broker with a full page cache, minus
  the cost of its reclaim (``_settle_reclaimed``);
* ``read_sequential``: every message back through ``get_message`` (32 a call), the CommitLog
  read into the page cache before each run;
* ``sync_flush_64_writers``: SYNC_FLUSH, 64 asyncio tasks each awaiting ``put_message``, with
  the broker's GIL switch interval (0.5 ms) so the group commit thread is not kept waiting;
* ``queues_16`` vs ``queues_10000``: the same load spread over 16 and over 10,000 queues,
  as single appends and as batches of 32 (``*_batch32``); ``cost_of_10000_queues*_ratio``
  compares the two medians, ``*_paired_ratio`` is the median of the costs of the runs taken
  back to back (the two loads alternate);
* ``rss``: resident memory while ``rss_gb`` GiB are written (``RssAnon`` is the process's own
  memory; ``RssFile`` the mapped file pages it currently holds).
"""

from __future__ import annotations

import asyncio
import functools
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.machine import disk_seq_write, page_cache_write, python_loop_ns
from data_plane.interpreter import interpreter_facts
from data_plane.store import fastpath
from data_plane.store.config import PAGE_SIZE_BYTES, FlushDiskType, StoreConfig
from data_plane.store.message import Message
from data_plane.store.message_store import MessageStore

TOPIC = "BenchTopic"
SYNC_FLUSH_SWITCH_INTERVAL_S = 0.0005  # the broker default (BrokerConfig.gil_switch_interval_us)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    directory: str | None = None
    messages: int = 1_000_000
    body_bytes: int = 1024
    sync_seconds: float = 3.0
    queue_messages: int = 300_000
    rss_gb: float = 10.0
    disk_mb: int = 1024
    repeats: int = 3

    @classmethod
    def quick(cls, directory: str | None = None) -> BenchOptions:
        return cls(
            directory=directory,
            messages=200_000,
            sync_seconds=2.0,
            queue_messages=100_000,
            rss_gb=1.0,
            disk_mb=256,
            repeats=1,
        )


def _messages(count: int, body: bytes, queues: int) -> list[Message]:
    return [
        Message(
            topic=TOPIC,
            body=body,
            queue_id=i % queues,
            properties={"TAGS": "TagA", "UNIQ_KEY": f"7F000001{os.getpid():04X}{i:020X}"},
        )
        for i in range(count)
    ]


def _rate(count: int, seconds: float) -> dict[str, float]:
    return {"msgs": count, "seconds": round(seconds, 3), "msgs_per_s": round(count / seconds) if seconds else 0.0}


Run = Callable[[], tuple[int, int]]  # does the work; returns (messages, bytes)


def _measure_interleaved(
    runs: dict[str, Run], repeats: int, settle: Callable[[], None] = os.sync
) -> dict[str, dict[str, Any]]:
    """Time each of ``runs`` ``repeats`` times, alternating between them (each in turn first and
    last) so that the machine's drift (large on a shared virtual machine) hits all of them alike. Each
    figure is the median run; every run's rate is kept. ``settle`` runs before each run, untimed: by default everything
    written so far goes to disk, so that no run pays for the write-back of the one before."""
    samples: dict[str, list[tuple[float, int, float, int]]] = {name: [] for name in runs}
    in_order: dict[str, list[int]] = {name: [] for name in runs}
    order = list(runs.items())
    for _ in range(repeats):
        for name, run in order:
            settle()
            t = time.perf_counter()
            count, nbytes = run()
            dt = time.perf_counter() - t
            rate = count / dt if dt else 0.0
            samples[name].append((rate, count, dt, nbytes))
            in_order[name].append(round(rate))
        # With the queue-spread loads, whichever ran second in a pair was ~5-10 % slower (the
        # first's write-back or page cache, most likely; not pinned down): take turns.
        order.reverse()
    out = {}
    for name, got in samples.items():
        got.sort()
        rate, count, dt, nbytes = got[len(got) // 2]
        out[name] = {
            "msgs": count,
            "seconds": round(dt, 3),
            "msgs_per_s": round(rate),
            "mb_per_s": round(nbytes / dt / 1e6, 1) if dt else 0.0,
            "runs_msgs_per_s": [round(r[0]) for r in got],
            "runs_in_order_msgs_per_s": in_order[name],  # (the i-th run of each alternated with the others')
        }
    return out


def _measure(run: Run, repeats: int, settle: Callable[[], None] = os.sync) -> dict[str, Any]:
    return _measure_interleaved({"run": run}, repeats, settle)["run"]


def _drop_written_pages(stores: list[MessageStore]) -> None:
    """Take the bytes the stores' CommitLogs hold so far out of the page cache (they are on disk:
    callers sync first). Only what was written: the pages populated ahead of the writer stay."""
    for store in stores:
        for mf in list(store.commit_log.mfq.files):
            written = mf.wrote_position // PAGE_SIZE_BYTES * PAGE_SIZE_BYTES
            if mf.fd >= 0 and written > 0:
                os.posix_fadvise(mf.fd, 0, written, os.POSIX_FADV_DONTNEED)


def _settle_reclaimed(store: MessageStore) -> None:
    """Write everything to disk, then take what the store's CommitLog holds out of the page cache
    (``_drop_written_pages``). The next run's appends then get pages the machine backs, freed a
    moment before, as a broker whose page cache is full gets pages by reclaim -- without the
    reclaim's own cost (the kernel's scan of its page lists), so this is that broker's best case.
    Without it each run grows the page cache into memory unused since boot or handed back to the
    hypervisor (which takes freed memory back within seconds), and every new 4 KiB page costs a
    host fault: ~40 us of kernel time here once the memory the probes freed was used up, which
    held batched appends to ~0.1 million a second (``page_cache_write`` measures that case)."""
    os.sync()
    _drop_written_pages([store])


def _settle_cached(store: MessageStore, chunk: int = 1 << 20) -> None:
    """Write everything to disk, then read what the store's CommitLog holds into the page cache,
    so the reads measure the store, not the disk."""
    os.sync()
    buf = bytearray(chunk)
    for mf in list(store.commit_log.mfq.files):
        if mf.fd >= 0:
            pos = 0
            while pos < mf.wrote_position and (n := os.preadv(mf.fd, [buf], pos)):
                pos += n


def _store(directory: str, name: str, **changes: Any) -> MessageStore:
    path = os.path.join(directory, name)
    shutil.rmtree(path, ignore_errors=True)
    store = MessageStore(StoreConfig(store_path=path, **changes))
    store.start()
    return store


def bench_append_and_read(directory: str, opts: BenchOptions) -> dict[str, Any]:
    body = os.urandom(opts.body_bytes)
    pool = _messages(8192, body, 16)
    store = _store(directory, "append")
    out: dict[str, Any] = {}
    try:
        append = store.entry.append
        n = opts.messages

        def singles() -> tuple[int, int]:
            before = store.put_bytes
            for i in range(n):
                append([pool[i & 8191]])
            return n, store.put_bytes - before

        reclaimed = functools.partial(_settle_reclaimed, store)
        out["append_single"] = _measure(singles, opts.repeats, reclaimed)
        batches = [list(pool[q::16])[:32] for q in range(16)]

        def batched() -> tuple[int, int]:
            before = store.put_bytes
            for i in range(n // 32):
                append(batches[i & 15])
            return (n // 32) * 32, store.put_bytes - before

        out["append_batch32"] = _measure(batched, opts.repeats, reclaimed)

        def read_all() -> tuple[int, int]:
            got = nbytes = 0
            get = store.get_message
            for q in range(16):
                offset = 0
                while True:
                    r = get(TOPIC, q, offset, 32)
                    if not r.messages:
                        break
                    got += len(r.messages)
                    nbytes += r.buffer_total_size
                    offset = r.next_begin_offset
            return got, nbytes

        out["read_sequential"] = _measure(read_all, opts.repeats, functools.partial(_settle_cached, store))
    finally:
        store.destroy()
    return out


def bench_sync_flush(directory: str, opts: BenchOptions, writers: int = 64) -> dict[str, Any]:
    body = os.urandom(opts.body_bytes)
    store = _store(directory, "sync", flush_disk_type=FlushDiskType.SYNC_FLUSH)
    pool = _messages(4096, body, 16)
    try:

        async def run() -> tuple[int, float, int]:
            deadline = time.perf_counter() + opts.sync_seconds
            done = 0
            failed = 0

            async def writer(k: int) -> None:
                nonlocal done, failed
                i = k
                while time.perf_counter() < deadline:
                    r = await store.put_message(pool[i & 4095])
                    if r.ok:
                        done += 1
                    else:
                        failed += 1
                    i += writers

            t = time.perf_counter()
            await asyncio.gather(*(writer(k) for k in range(writers)))
            return done, time.perf_counter() - t, failed

        # The group commit thread must get the GIL back promptly after each fdatasync while the
        # writers' loop is busy: CPython's default switch interval (5 ms) lets the loop keep it
        # that long. `orbit broker` sets the same (gil_switch_interval_us, docs/broker.md).
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SYNC_FLUSH_SWITCH_INTERVAL_S)
        try:
            samples = sorted((_run_loop(run()) for _ in range(opts.repeats)), key=lambda x: x[0] / x[1])
        finally:
            sys.setswitchinterval(switch)
        done, dt, _failed = samples[len(samples) // 2]
        out: dict[str, Any] = dict(_rate(done, dt))
        out["runs_msgs_per_s"] = [round(d / t) for d, t, _f in samples]
        out["writers"] = writers
        out["failed"] = sum(f for _d, _t, f in samples)
        return out
    finally:
        store.destroy()


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _spread_workload(directory: str, body: bytes, queues: int, n: int, batch: int) -> tuple[MessageStore, Run]:
    store = _store(directory, f"queues{queues}-{batch}")
    pool = _messages(min(n, 20_000), body, queues)
    size = len(pool)
    # Every queue exists before the clock starts: this measures steady state, not creation.
    for q in range(queues):
        m = pool[q % size]
        m.queue_id = q
        store.entry.append([m])
    append = store.entry.append
    rounds = n // batch

    def run() -> tuple[int, int]:
        before = store.put_bytes
        for i in range(rounds):
            q = i % queues
            msgs = [pool[(i * batch + k) % size] for k in range(batch)]
            for m in msgs:
                m.queue_id = q
            append(msgs)
        return rounds * batch, store.put_bytes - before

    return store, run


def _sync_commit_logs(stores: list[MessageStore]) -> None:
    """Write the stores' CommitLog files to disk, and nothing else: the ConsumeQueue and
    IndexFile pages stay dirty and go to disk at the kernel's own pace, as in a running store.
    (A global ``sync`` write-protects every dirty mapped page, so the 10,000-queue run that
    followed took a write fault on each of its 10,000 ConsumeQueue pages — a fault a running
    store takes about once in the kernel's 30 s dirty expiry.)"""
    for store in stores:
        for mf in list(store.commit_log.mfq.files):
            if mf.fd >= 0:
                os.fdatasync(mf.fd)
    _drop_written_pages(stores)  # and, as before each append run, out of the page cache


def bench_queue_spread(directory: str, opts: BenchOptions) -> dict[str, Any]:
    """The same load over 16 and over 10,000 queues, the runs of the two alternating: single
    messages (each append lands in another queue than the one before) and batches of 32 (one
    queue a batch). Before each run the CommitLogs go to disk and leave the page cache
    (``_sync_commit_logs``)."""
    body = os.urandom(opts.body_bytes)
    out: dict[str, Any] = {}
    for batch, label in ((1, ""), (32, "_batch32")):
        stores = []
        runs: dict[str, Run] = {}
        try:
            for q in (16, 10_000):
                store, run = _spread_workload(directory, body, q, opts.queue_messages, batch)
                stores.append(store)
                runs[f"queues_{q}{label}"] = run
            settle = functools.partial(_sync_commit_logs, list(stores))
            out.update(_measure_interleaved(runs, opts.repeats, settle))
        finally:
            for store in stores:
                store.destroy()
        a = out[f"queues_16{label}"]["msgs_per_s"]
        b = out[f"queues_10000{label}"]["msgs_per_s"]
        out[f"cost_of_10000_queues{label}_ratio"] = round(1 - b / a, 3) if a else None
        # The same from each pair of runs taken back to back, whose drift is alike: the median
        # of the pairs' costs.
        pairs = zip(
            out[f"queues_16{label}"]["runs_in_order_msgs_per_s"],
            out[f"queues_10000{label}"]["runs_in_order_msgs_per_s"],
            strict=True,
        )
        costs = [1 - y / x for x, y in pairs if x]
        out[f"cost_of_10000_queues{label}_paired_ratio"] = round(statistics.median(costs), 3) if costs else None
    return out


def _rss() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def bench_rss(directory: str, opts: BenchOptions) -> dict[str, Any]:
    body = os.urandom(opts.body_bytes)
    store = _store(directory, "rss", flush_interval_commit_log_ms=200)
    pool = _messages(8192, body, 16)
    batches = [pool[q::16][:32] for q in range(16)]
    samples: list[dict[str, int]] = []
    target = int(opts.rss_gb * (1 << 30))
    step = max(target // 10, 1)
    next_sample = 0
    try:
        i = 0
        t = time.perf_counter()
        while store.put_bytes < target:
            store.entry.append(batches[i & 15])
            i += 1
            if store.put_bytes >= next_sample:
                s = _rss()
                s["written_bytes"] = store.put_bytes
                samples.append(s)
                next_sample += step
        dt = time.perf_counter() - t
    finally:
        store.destroy()
    anon = [s["RssAnon"] for s in samples]
    rss = [s["VmRSS"] for s in samples]
    return {
        "written_gb": round(opts.rss_gb, 2),
        "seconds": round(dt, 1),
        "rss_mb_first_last_max": [round(rss[0] / 2**20), round(rss[-1] / 2**20), round(max(rss) / 2**20)],
        "rss_anon_mb_first_last_max": [round(anon[0] / 2**20), round(anon[-1] / 2**20), round(max(anon) / 2**20)],
        "samples": samples,
    }


def run(opts: BenchOptions, *, log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    # Flush threads hand results back to the event loop: let them have the GIL within 1 ms
    # rather than CPython's default 5 ms (the broker does the same).
    sys.setswitchinterval(0.001)
    own = opts.directory is None
    directory = opts.directory or tempfile.mkdtemp(prefix="orbit-bench-")
    os.makedirs(directory, exist_ok=True)
    result: dict[str, Any] = {
        "schema": "orbit.bench.store/1",
        "machine": {
            "cpus": os.cpu_count(),
            **interpreter_facts(),
            "platform": platform.platform(),
            "python_loop_ns": python_loop_ns(),
        },
        "compiled_fastpath": fastpath.COMPILED,
        "message_bytes": opts.body_bytes,
        "directory": directory,
    }
    try:
        log("disk sequential write ...")
        result["disk_seq_write"] = disk_seq_write(directory, opts.disk_mb)
        result["page_cache_write"] = page_cache_write(directory, opts.disk_mb)
        log("append (single, batch of 32) and sequential read ...")
        result.update(bench_append_and_read(directory, opts))
        log("SYNC_FLUSH with 64 concurrent writers ...")
        result["sync_flush_64_writers"] = bench_sync_flush(directory, opts)
        log("16 queues vs 10,000 queues ...")
        result.update(bench_queue_spread(directory, opts))
        log(f"resident memory while writing {opts.rss_gb} GiB ...")
        result["rss"] = bench_rss(directory, opts)
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)
    for probe, key in (("disk_seq_write", "ratio_to_disk"), ("page_cache_write", "ratio_to_page_cache")):
        limit = result[probe]["last_quarter_mb_per_s" if probe == "page_cache_write" else "mb_per_s"]
        limit *= 2**20 / 1e6  # the probes count MiB, the appends MB
        result[key] = {
            name: round(result[name]["mb_per_s"] / limit, 3) for name in ("append_single", "append_batch32") if limit
        }
    return result
