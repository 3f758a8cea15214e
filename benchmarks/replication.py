"""Replication throughput on loopback: ``python -m benchmarks.replication [--mb 512]``.

Fills a master store with ``--mb`` MiB of 1 KiB messages (TAGS, KEYS, UNIQ_KEY, as a stock
producer sends), then starts a slave in another process (``--slave`` mode) and times how long
the slave takes to hold the whole log — from its connect to its acknowledgement of the last
byte, as the master sees it — with its own ConsumeQueues and index built on the way. Prints
one JSON line. A command, not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

from data_plane.store import Message, MessageStore, StoreConfig
from data_plane.store.ha.master import HAService
from data_plane.store.ha.slave import HAClient


def _config(path: str, file_mb: int) -> StoreConfig:
    return StoreConfig(
        store_path=path,
        commit_log_file_size_bytes=file_mb * 1024 * 1024,
        reserve_ahead_bytes=0,
        index_hash_slots=500_000,
        index_max_entries=2_000_000,
    )


async def _slave(path: str, port: int, file_mb: int) -> None:
    store = MessageStore(_config(path, file_mb))
    store.start()
    client = HAClient(store, "127.0.0.1", port, report_interval_ms=200)
    client.start()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await client.stop()
    store.shutdown()


async def _master(args: argparse.Namespace, root: str) -> dict[str, object]:
    store = MessageStore(_config(os.path.join(root, "master"), args.file_mb))
    store.start()
    body = os.urandom(1024)
    batch = [
        Message(topic="BenchHa", body=body, queue_id=0, properties={"TAGS": "t", "KEYS": "k", "UNIQ_KEY": "u"})
    ] * 32
    target = args.mb * 1024 * 1024
    n = 0
    while store.max_phy_offset() < target:
        for q in range(8):
            for m in batch:
                m.queue_id = q
            store.entry.append(batch)
            n += 32
    total = store.max_phy_offset()
    service = HAService(store, host="127.0.0.1", port=0, chunk_bytes=args.chunk_kb * 1024)
    await service.start()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.replication",
        "--slave",
        os.path.join(root, "slave"),
        "--port",
        str(service.port),
        "--file-mb",
        str(args.file_mb),
        stdin=asyncio.subprocess.PIPE,
    )
    try:
        # The slave's first report (offset 0) comes right after its handshake.
        if not await service.wait_for_slave(0, 60_000):
            raise RuntimeError("the slave did not connect")
        started = time.perf_counter()
        if not await service.wait_for_slave(total, 3_600_000):
            raise RuntimeError("the slave did not catch up")
        took = time.perf_counter() - started
    finally:
        assert child.stdin is not None
        child.stdin.close()
        await child.wait()
        await service.stop()
        store.shutdown()
    return {
        "bytes": total,
        "messages": n,
        "chunk_kib": args.chunk_kb,
        "seconds": round(took, 3),
        "mb_per_s": round(total / took / 1e6, 1),
        "msgs_per_s": round(n / took),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=int, default=512, help="MiB of log to replicate")
    p.add_argument("--chunk-kb", type=int, default=256, help="data frame size limit")
    p.add_argument("--file-mb", type=int, default=256, help="CommitLog file size")
    p.add_argument("--dir", default=None, help="parent directory for the two stores (default: a temp dir)")
    p.add_argument("--slave", default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.slave:
        asyncio.run(_slave(args.slave, args.port, args.file_mb))
        return 0
    root = tempfile.mkdtemp(prefix="orbit-ha-bench-", dir=args.dir)
    try:
        print(json.dumps(asyncio.run(_master(args, root))))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
