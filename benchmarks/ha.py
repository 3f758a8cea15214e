"""``orbit bench ha``: replication figures of a real broker group on this machine, as JSON.

1. ``publish``: the same batched publishing (producer processes, batches of 32 x 1 KiB, several
   batches in flight each) against a broker group of master + slave, once with an ASYNC_MASTER
   and once with a SYNC_MASTER (every batch answered only once the slave holds it) — messages
   per second of each and their ratio (the issue's bar: SYNC >= 50% of ASYNC);
2. ``catch_up``: the slave stopped, the master given ``catch_up_mb`` MiB, the slave started
   again — MiB/s from its restart until its CommitLog reaches the master's end.

Each run starts a fresh LocalCluster (name server, master, slave) under a temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from data_plane.local_cluster import LocalCluster, spawn

TOPIC = "BenchHa"


@dataclass(frozen=True)
class HaBenchOptions:
    seconds: float = 10.0
    warmup_s: float = 2.0
    producers: int = 2
    batches_in_flight: int = 8
    batch: int = 32
    message_bytes: int = 1024
    catch_up_mb: int = 512
    flush: str = "ASYNC_FLUSH"

    @classmethod
    def quick(cls) -> HaBenchOptions:
        return cls(seconds=3.0, warmup_s=1.0, catch_up_mb=128)


def _publish_opts(o: HaBenchOptions) -> dict[str, Any]:
    return {
        "seconds": o.seconds, "warmup_s": o.warmup_s, "batch": o.batch,
        "batches_in_flight": o.batches_in_flight, "message_bytes": o.message_bytes,
    }  # fmt: skip


def _status(addr: str) -> dict[str, str]:
    from sdk.admin import AdminClient

    async def go() -> dict[str, str]:
        admin = AdminClient([addr])
        try:
            return await admin.broker_status(addr)
        finally:
            await admin.close()

    return asyncio.run(go())


def _wait(cond: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def _create_topic(namesrv: str) -> None:
    from sdk.admin import AdminClient

    async def go() -> None:
        admin = AdminClient([namesrv])
        try:
            await admin.create_topic(TOPIC, queue_nums=8)
        finally:
            await admin.close()

    asyncio.run(go())


def publisher(namesrv: str, opts: dict[str, Any]) -> dict[str, int]:
    """One producer process: ``batches_in_flight`` lanes sending batches back to back for
    warm-up + ``seconds``; only SEND_OK counts as acknowledged (a SYNC_MASTER's
    FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE is counted apart)."""
    from sdk import Message, Producer, SendStatus

    async def go() -> dict[str, int]:
        producer = Producer("bench-ha", namesrv_addrs=[namesrv])
        await producer.start()
        body = b"x" * int(opts["message_bytes"])
        counts = {"send_ok": 0, "not_ok": 0, "errors": 0}
        measure_from = time.perf_counter() + float(opts["warmup_s"])
        stop_at = measure_from + float(opts["seconds"])

        async def lane() -> None:
            while (t0 := time.perf_counter()) < stop_at:
                try:
                    r = await producer.send_batch([Message(TOPIC, body) for _ in range(int(opts["batch"]))])
                except Exception:
                    counts["errors"] += 1
                    continue
                if t0 >= measure_from:
                    counts["send_ok" if r.status is SendStatus.SEND_OK else "not_ok"] += int(opts["batch"])

        await asyncio.gather(*(lane() for _ in range(int(opts["batches_in_flight"]))))
        await producer.shutdown()
        return counts

    return asyncio.run(go())


def _publish(namesrv: str, o: HaBenchOptions, *, seconds: float | None = None) -> dict[str, Any]:
    opts = _publish_opts(o)
    if seconds is not None:
        opts.update(seconds=seconds, warmup_s=0.0)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(o.producers) as pool:
        results = pool.starmap(publisher, [(namesrv, opts)] * o.producers)
    total = {k: sum(r[k] for r in results) for k in ("send_ok", "not_ok", "errors")}
    return {"msgs_per_s": round(total["send_ok"] / float(opts["seconds"])), **total}


@contextlib.contextmanager
def _cluster(root: str, role: str, o: HaBenchOptions) -> Iterator[LocalCluster]:
    with LocalCluster(root, namesrv_port=0, broker_port=0, flush=o.flush, slaves=1, master_role=role) as cluster:
        slave = cluster.brokers["broker-a-s1"]
        _wait(lambda: _status(slave).get("haConnected") == "True", "the slave to connect")
        yield cluster


def run(o: HaBenchOptions, log: Any = lambda m: None) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="orbit-bench-ha-")
    out: dict[str, Any] = {"options": asdict(o), "cpus": os.cpu_count()}
    try:
        for role in ("ASYNC_MASTER", "SYNC_MASTER"):
            log(f"publish, {role} + slave, {o.seconds:.0f} s ...")
            with _cluster(os.path.join(base, role), role, o) as cluster:
                _create_topic(cluster.namesrv)
                out[role] = _publish(cluster.namesrv, o)
                master = _status(cluster.brokers["broker-a"])
                out[role]["ha_lag_bytes_at_end"] = int(master.get("haLagBytes", "-1"))
            log(f"  {out[role]['msgs_per_s']:,} msgs/s")
        a, s = out["ASYNC_MASTER"]["msgs_per_s"], out["SYNC_MASTER"]["msgs_per_s"]
        out["sync_to_async_ratio"] = round(s / a, 3) if a else None
        log(f"catch-up of {o.catch_up_mb} MiB ...")
        out["catch_up"] = _catch_up(os.path.join(base, "catch-up"), o)
        log(f"  {out['catch_up']['mb_per_s']} MiB/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def _catch_up(root: str, o: HaBenchOptions) -> dict[str, Any]:
    with _cluster(root, "ASYNC_MASTER", o) as cluster:
        slave = next(c for c in cluster.children if c.name == "broker-a-s1")
        slave.proc.send_signal(signal.SIGTERM)
        slave.proc.wait(30)
        cluster.children.remove(slave)
        _create_topic(cluster.namesrv)
        master_addr = cluster.brokers["broker-a"]
        target = o.catch_up_mb * 1024 * 1024
        start_offset = int(_status(master_addr)["commitLogMaxOffset"])
        while int(_status(master_addr)["commitLogMaxOffset"]) - start_offset < target:
            _publish(cluster.namesrv, o, seconds=1.0)
        end = int(_status(master_addr)["commitLogMaxOffset"])
        began = time.monotonic()
        restarted = spawn("broker", "broker-a-s1", cluster.broker_args(1, cluster.namesrv, []), cluster.run_dir)
        cluster.children.append(restarted)
        _wait(lambda: int(_status(restarted.address)["commitLogMaxOffset"]) >= end, "the slave to catch up", 600)
        took = time.monotonic() - began
        behind = end - start_offset
        return {
            "bytes": behind,
            "seconds_from_restart": round(took, 2),
            "mb_per_s": round(behind / took / 1024 / 1024, 1),
        }
