"""A diverged slave's cut, on one store: ``python -m benchmarks.truncation [--file-mb 1024]``.

Fills a store — one CommitLog file of ``--file-mb`` MiB holding ``--fill-mb`` MiB of 1 KiB
messages with TAGS, KEYS and UNIQ_KEY, as a stock producer sends — then does on an event loop
what the HA client does on a handshake that truncates: the candidates (``last_records``) on a
worker thread, the cut of the newest ``--cut-records`` records (``MessageStore.cut_log``) on the
loop and its disk work (``LogCut.finish``) on a worker thread, while a ``LoopStallGauge`` runs on
that loop; then restarts the store (recovery over the cut file). Prints one JSON line: the
candidates' time, the cut's time on the loop and in all, the loop's largest stall over it, the
restart's time. A command, not a test: figures depend on the machine and its disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time

from data_plane.loop_stall import LoopStallGauge
from data_plane.store import Message, MessageStore, PutMessageStatus, StoreConfig
from data_plane.store.ha.slave import last_records
from data_plane.tasks import cancel_all


def _config(path: str, file_mb: int) -> StoreConfig:
    return StoreConfig(
        store_path=path,
        commit_log_file_size_bytes=file_mb * 1024 * 1024,
        preallocate_next_file=False,
        reserve_ahead_bytes=0,
        index_hash_slots=500_000,
        index_max_entries=4_000_000,
    )


def _fill(store: MessageStore, fill_mb: int) -> int:
    body = os.urandom(1024)
    n = 0
    while store.max_phy_offset() < fill_mb * 1024 * 1024:
        batch = [  # (a batch goes to one queue)
            Message("Bench", body, n // 32 % 8, properties={"TAGS": "t", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:020d}"})
            for i in range(n, n + 32)
        ]
        r = store.put_messages_blocking(batch)
        if r.status is not PutMessageStatus.PUT_OK:
            raise RuntimeError(f"filling the store: {r.status.name} {r.reason}")
        n += 32
    return n


async def _rejoin(store: MessageStore, cut_records: int) -> dict[str, float]:
    gauge = LoopStallGauge()
    task = asyncio.create_task(gauge.run())
    await asyncio.sleep(0.1)
    started = time.perf_counter()
    candidates = await asyncio.to_thread(last_records, store)
    candidates_ms = (time.perf_counter() - started) * 1000
    offset = candidates[min(cut_records, len(candidates)) - 1][0]
    started = time.perf_counter()
    cut = store.cut_log(offset)
    on_loop_ms = (time.perf_counter() - started) * 1000
    assert cut is not None
    await asyncio.to_thread(cut.finish)
    cut_ms = (time.perf_counter() - started) * 1000
    await asyncio.sleep(0.05)
    await cancel_all([task])
    return {
        "candidates_ms": round(candidates_ms, 1),
        "cut_on_loop_ms": round(on_loop_ms, 2),
        "cut_ms": round(cut_ms, 1),
        "cut_bytes": candidates[0][0] + candidates[0][1] - offset,
        "loop_stall_max_ms": round(gauge.max_ms, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file-mb", type=int, default=1024, help="the CommitLog file's size")
    ap.add_argument("--fill-mb", type=int, default=256, help="how much of it holds messages")
    ap.add_argument("--cut-records", type=int, default=100, help="how many of the newest records are cut")
    ap.add_argument("--dir", default=None, help="where the store goes (a temporary directory by default)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="orbit-truncation-", dir=args.dir)
    try:
        config = _config(os.path.join(root, "store"), args.file_mb)
        store = MessageStore(config)
        store.start()
        messages = _fill(store, args.fill_mb)
        figures = asyncio.run(_rejoin(store, args.cut_records))
        store.shutdown()
        started = time.perf_counter()
        again = MessageStore(config)
        again.start()
        figures["restart_ms"] = round((time.perf_counter() - started) * 1000, 1)
        again.shutdown()
        print(json.dumps({"file_mb": args.file_mb, "fill_mb": args.fill_mb, "messages": messages, **figures}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
