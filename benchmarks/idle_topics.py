"""Idle topics cost nothing, on one store: ``python -m benchmarks.idle_topics [--topics 1000]``.

Writes one message to each queue of ``--topics`` topics of ``--queues`` queues, leaves them
unused past the idle time (``--idle-s``) and runs the idle sweep (store/idle_queues.py) on an
event loop, with a ``LoopStallGauge`` on it; counts the ConsumeQueue files mapped (the store's
count and /proc/self/maps) and the process's open descriptors before and after. Then, per
topic, the first message after idle: a send to queue 0 (``put_message``, timed to its answer:
*stored*) and the read of it at the queue's end (``get_message``, as a pull does: *consumed*,
from the send); then the same again on the now warm queues. Prints the JSON (p50/p99 over the
topics, in ms) and writes it to ``--out`` (a file, or a directory for
``idle_topics-<time>-<commit>.json``). In-process: no network, no broker's request handling. A
command, not a test: figures depend on the machine and its disk.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from benchmarks.output import emit, header, result_path
from data_plane.loop_stall import LoopStallGauge
from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, StoreConfig
from data_plane.store.idle_queues import IdleQueues, open_fds
from data_plane.tasks import cancel_all


def _maps_under(directory: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if directory + os.sep in line)


def _resources(store: MessageStore, idle: IdleQueues) -> dict[str, int]:
    info = idle.runtime_info()
    return {
        "mapped_queue_files": info["mappedQueueFiles"],
        "maps_of_consume_queues": _maps_under(store.config.consume_queue_path),
        "idle_closed_queues": info["idleClosedQueues"],
        "open_fds": open_fds(),
    }


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered) * 1000, 3),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "max": round(ordered[-1] * 1000, 3),
    }


async def _first_messages(store: MessageStore, topics: list[str]) -> dict[str, Any]:
    """Send one message to queue 0 of each topic and read it back, timed."""
    stored: list[float] = []
    consumed: list[float] = []
    for topic in topics:
        offset = store.max_offset_in_queue(topic, 0)
        started = time.perf_counter()
        r = await store.put_message(Message(topic, b"after idle", queue_id=0))
        stored.append(time.perf_counter() - started)
        if r.status is not PutMessageStatus.PUT_OK:
            raise RuntimeError(f"send to {topic}: {r.status.name}")
        got = store.get_message(topic, 0, offset, 32)
        consumed.append(time.perf_counter() - started)
        if got.status is not GetMessageStatus.FOUND:
            raise RuntimeError(f"read of {topic}: {got.status.name}")
        for m in got.messages:
            m.release()
    return {"stored_ms": _ms(stored), "consumed_ms": _ms(consumed)}


async def _run(store: MessageStore, topics: list[str], queues: int, idle_s: float) -> dict[str, Any]:
    idle = IdleQueues(store, idle_s)
    for topic in topics:
        for q in range(queues):
            r = await store.put_message(Message(topic, b"first", queue_id=q))
            if r.status is not PutMessageStatus.PUT_OK:
                raise RuntimeError(f"filling {topic}: {r.status.name}")
    before = _resources(store, idle)
    await asyncio.sleep(idle_s)  # (the sweep takes a queue first seen as in use when last written)
    gauge = LoopStallGauge()
    task = asyncio.create_task(gauge.run())
    await asyncio.sleep(0.1)
    started = time.perf_counter()
    closed = await idle.sweep()
    sweep_s = time.perf_counter() - started
    await asyncio.sleep(0.05)
    await cancel_all([task])
    after = _resources(store, idle)
    after_idle = await _first_messages(store, topics)
    warm = await _first_messages(store, topics)
    return {
        "before_sweep": before,
        "after_sweep": after,
        "queues_closed": closed,
        "sweep_ms": round(sweep_s * 1000, 1),
        "sweep_loop_stall_max_ms": round(gauge.max_ms, 1),
        "first_message_after_idle": after_idle,
        "warm_queue": warm,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--queues", type=int, default=4, help="queues a topic")
    ap.add_argument("--idle-s", type=float, default=1.0, help="idle_queue_close_s")
    ap.add_argument("--dir", default=None, help="where the store goes (a temporary directory by default)")
    ap.add_argument("--out", default=None, help="also write the JSON here (a file, or a directory)")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="orbit-idle-topics-", dir=args.dir)
    try:
        config = StoreConfig(
            store_path=os.path.join(root, "store"),
            commit_log_file_size_bytes=64 * 1024 * 1024,
            preallocate_next_file=False,
            reserve_ahead_bytes=0,
        )
        store = MessageStore(config)
        store.start()
        try:
            topics = [f"Idle{i:05d}" for i in range(args.topics)]
            figures = asyncio.run(_run(store, topics, args.queues, args.idle_s))
        finally:
            store.shutdown()
        result = {
            **header("idle_topics", argv),
            "topics": args.topics,
            "queues_per_topic": args.queues,
            "idle_queue_close_s": args.idle_s,
            **figures,
        }
        emit(result, result_path(args.out, "idle_topics"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
