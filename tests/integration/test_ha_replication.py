"""Master and slave stores replicating over a real TCP connection on 127.0.0.1 (port 0): the
slave's log is byte-identical and its ConsumeQueues and index answer reads; restarts, late
starts, divergence and kill -9 converge; wait_for_slave and the lag metric."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from data_plane.store import MessageStore
from data_plane.store.ha import HAClient, HAService
from tests.ha_support import assert_replica, ha_config, log_bytes, put_many
from tests.integration.helpers import until

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]


def new_store(path: Path, **changes: object) -> MessageStore:
    s = MessageStore(ha_config(str(path), **changes))
    s.start()
    return s


async def start_service(master: MessageStore, **ha: Any) -> HAService:
    service = HAService(master, host="127.0.0.1", port=ha.pop("port", 0), **{"poll_interval_ms": 10, **ha})
    await service.start()
    return service


class Pair:
    """A master store with its HAService, and a slave store with its HAClient. Tests swap the
    client or the service as they go; ``replication`` stops whatever is current at the end."""

    def __init__(self, master: MessageStore, service: HAService, slave: MessageStore | None) -> None:
        self.master = master
        self.service = service
        self.slave = slave
        self.client: HAClient | None = None

    @property
    def replica(self) -> MessageStore:
        assert self.slave is not None
        return self.slave

    def connect(self) -> HAClient:
        c = HAClient(self.replica, "127.0.0.1", self.service.port, report_interval_ms=50, reconnect_initial_ms=20)
        c.start()
        self.client = c
        return c

    def caught_up(self) -> bool:
        return self.replica.max_phy_offset() == self.master.max_phy_offset()

    def acked(self) -> bool:
        return self.service.max_acked_offset == self.master.max_phy_offset()


@asynccontextmanager
async def replication(
    tmp_path: Path, *, slave: bool = True, connect: bool = True, store: dict[str, Any] | None = None, **ha: Any
) -> AsyncIterator[Pair]:
    master = new_store(tmp_path / "master", **(store or {}))
    replica = new_store(tmp_path / "slave", **(store or {})) if slave else None
    pair = Pair(master, await start_service(master, **ha), replica)
    try:
        if slave and connect:
            pair.connect()
        yield pair
    finally:
        if pair.client is not None:
            await pair.client.stop()
        await pair.service.stop()
        if pair.slave is not None:
            pair.slave.shutdown()
        master.shutdown()


async def test_live_replication_identical_and_queryable(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with replication(tmp_path) as r:
        for i in range(10):
            put_many(r.master, rng, 80, start=i * 80)
            r.service.notify()
            await asyncio.sleep(0.005)
        await until(r.caught_up, "slave caught up")
        assert_replica(r.master, r.replica, keys=("HaA#m-0", "HaB#m-400", "HaB#Um000000000799"))
        await until(r.acked, "ack")
        (lag,) = r.service.lag()
        assert lag.lag_bytes == 0
        assert lag.lag_seconds == 0


async def test_restart_catches_up_from_own_offset_and_lag(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with replication(tmp_path) as r:
        master, slave, service = r.master, r.replica, r.service
        put_many(master, rng, 300)
        await until(r.acked, "first ack")
        before = slave.max_phy_offset()
        assert r.client is not None
        await r.client.stop()
        slave.shutdown()
        await until(lambda: not service.connections, "disconnect")
        await asyncio.sleep(0.05)
        put_many(master, rng, 300, start=300)  # while the slave is down
        # lag is measured against a connected slave: reconnect, then look before it streams
        slave.start()
        assert slave.max_phy_offset() == before
        client = r.connect()
        await until(r.caught_up, "catch-up")
        assert client.bytes_received == master.max_phy_offset() - before  # from its own offset
        assert_replica(master, slave, keys=("HaA#m-450",))


async def test_lag_metric_bytes_and_seconds(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with replication(tmp_path, chunk_bytes=4096) as r:
        master, service = r.master, r.service
        put_many(master, rng, 50)
        await until(r.acked, "ack")
        acked = service.max_acked_offset
        # stall the slave's side: it stops reading, the master's pushes back up
        assert r.client is not None
        await r.client.stop()
        client = r.connect()
        await until(lambda: bool(service.lag()) and service.lag()[0].acked_offset == acked, "reconnect")
        slave_view = service.lag()  # connected and caught up
        await client.stop()  # the master drops it from its slaves as soon as it sees the close
        await asyncio.sleep(0.3)
        put_many(master, rng, 50, start=50)
        lags = service.lag()
        if lags:  # still connected on the master's side
            (lag,) = lags
            assert lag.lag_bytes == master.max_phy_offset() - acked > 0
            assert lag.lag_seconds >= 0.25, lag
        assert slave_view[0].lag_bytes == 0
        r.connect()
        await until(r.acked, "catch-up")
        await until(lambda: any(x.lag_bytes == 0 for x in service.lag()), "lag zero")
        assert next(x for x in service.lag() if x.lag_bytes == 0).lag_seconds == 0


async def test_late_slave_catches_up_backlog_in_large_chunks(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    small_files = {"commit_log_file_size_bytes": 2 * 1024 * 1024}
    async with replication(tmp_path, connect=False, store=small_files, chunk_bytes=256 * 1024) as r:
        put_many(r.master, rng, 6000)
        total = r.master.max_phy_offset()
        assert total > 5 * 1024 * 1024
        started = time.monotonic()
        client = r.connect()
        await until(r.caught_up, "backlog")
        took = time.monotonic() - started
        print(f"backlog {total} bytes in {took:.2f} s, {client.chunks_received} chunks")
        assert client.chunks_received <= total // (200 * 1024) + 2 * len(r.master.commit_log.mfq.files)
        assert_replica(r.master, r.replica, keys=("HaB#m-5998",))


async def test_wait_for_slave(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with replication(tmp_path, connect=False) as r:
        master, service = r.master, r.service
        # no slave: False after the timeout
        put_many(master, rng, 5)
        t0 = time.monotonic()
        assert await service.wait_for_slave(master.max_phy_offset(), 100) is False
        assert time.monotonic() - t0 >= 0.09
        assert not service.is_slave_ok(master.max_phy_offset())
        client = r.connect()
        results = []
        for i in range(20):
            put_many(master, rng, 3, start=100 + i * 3)
            results.append(asyncio.create_task(service.wait_for_slave(master.max_phy_offset(), 5_000)))
        assert all(await asyncio.gather(*results))
        assert service.is_slave_ok(master.max_phy_offset())
        await client.stop()  # the slave stops: sends after that are never acknowledged
        put_many(master, rng, 3, start=500)
        assert await service.wait_for_slave(master.max_phy_offset(), 200) is False


async def test_diverged_slave_truncates_and_converges(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with replication(tmp_path) as r:
        master, slave = r.master, r.replica
        put_many(master, rng, 200)
        await until(r.acked, "ack")
        assert r.client is not None
        await r.client.stop()
        common = master.max_phy_offset()
        put_many(slave, rng, 300, start=200, tag="old")  # the slave was a master for a while
        put_many(master, rng, 100, start=200, tag="new")
        assert log_bytes(slave)[:common] == log_bytes(master)[:common]
        client = r.connect()
        await until(lambda: r.caught_up() and client.truncations > 0, "converged")
        assert_replica(master, slave, keys=("HaA#new-201",))
        assert slave.query_message("HaA", "old-201") == []


async def test_master_down_then_back(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with replication(tmp_path) as r:
        port = r.service.port
        put_many(r.master, rng, 100)
        await until(r.caught_up, "first")
        await r.service.stop()
        await asyncio.sleep(0.2)  # the client retries with backoff meanwhile
        put_many(r.master, rng, 100, start=100)
        r.service = await start_service(r.master, port=port)
        await until(r.caught_up, "after master restart")
        assert_replica(r.master, r.replica)


@pytest.mark.timeout(120)
async def test_kill_9_slave_mid_stream_then_restart(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    slave_dir = tmp_path / "slave"

    def spawn(port: int) -> subprocess.Popen[bytes]:
        with open(tmp_path / "slave.log", "ab") as err:
            p = subprocess.Popen(
                [sys.executable, str(ROOT / "tests/integration/ha_slave_process.py"), str(slave_dir), str(port)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert p.stdout is not None
        assert p.stdout.readline().strip() == b"READY"
        p.stdout.close()
        return p

    async with replication(tmp_path, slave=False, chunk_bytes=16 * 1024) as r:
        master, service = r.master, r.service
        proc = None
        try:
            put_many(master, rng, 3000)  # a backlog, so the kill lands mid-stream
            proc = await asyncio.to_thread(spawn, service.port)
            await until(lambda: service.max_acked_offset > 0, what="some progress")
            for i in range(20):  # keep writing while it streams
                put_many(master, rng, 20, start=3000 + i * 20)
                await asyncio.sleep(0.002)
            assert service.max_acked_offset < master.max_phy_offset(), "kill was not mid-stream"
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
            put_many(master, rng, 200, start=4000)
            proc = await asyncio.to_thread(spawn, service.port)
            await until(lambda: any(c.acked == master.max_phy_offset() for c in service.connections), "converged", 60)
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
            proc = None
            slave = new_store(slave_dir)
            try:
                assert_replica(master, slave, keys=("HaA#m-4002",))
            finally:
                slave.shutdown()
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()


async def test_a_report_past_what_was_sent_is_refused(tmp_path: Path, seed: int) -> None:
    """A peer claiming to hold bytes the master never sent it must not resolve SYNC_MASTER
    waiters: the master drops the connection instead."""
    from data_plane.store.ha.protocol import HANDSHAKE_REPLY, REPORT, encode_handshake

    rng = random.Random(seed)
    async with replication(tmp_path, connect=False) as r:
        put_many(r.master, rng, 5)
        reader, writer = await asyncio.open_connection("127.0.0.1", r.service.port)
        try:
            writer.write(encode_handshake(0, []))  # an empty slave: streamed from the start
            await reader.readexactly(HANDSHAKE_REPLY.size)
            writer.write(REPORT.pack(1 << 40))
            await writer.drain()
            waiter = asyncio.create_task(r.service.wait_for_slave(r.master.max_phy_offset() + 1000, 1_000))
            assert await waiter is False
            await until(lambda: not r.service.connections, "the lying connection dropped", timeout_s=5)
        finally:
            writer.close()


async def test_a_master_of_an_older_epoch_is_refused_before_anything_is_truncated(tmp_path: Path, seed: int) -> None:
    """A diverged slave that knows of epoch 5 meets a master still serving epoch 4 (a stale
    master, or one not yet told of its election): refused, its log untouched. Once the master
    serves epoch 5 the slave truncates, follows, learns the epoch, and is in the in-sync set
    under its member id."""
    rng = random.Random(seed)
    epoch = {"master": 4}
    async with replication(tmp_path, connect=False, epoch=lambda: epoch["master"]) as r:
        master, slave = r.master, r.replica
        put_many(master, rng, 100)
        put_many(slave, rng, 150, tag="own")  # its own, never replicated tail
        slave.write_staged()
        before = log_bytes(slave)
        learned: list[int] = []
        client = HAClient(
            slave, "127.0.0.1", r.service.port, report_interval_ms=50, reconnect_initial_ms=20,
            member_id=7, min_master_epoch=lambda: 5, on_master_epoch=learned.append,
        )  # fmt: skip
        r.client = client
        client.start()
        await until(lambda: client.stale_masters >= 2, "the stale master refused twice")
        assert (client.truncations, client.connected, learned) == (0, False, [])
        assert log_bytes(slave) == before
        epoch["master"] = 5
        await until(lambda: r.caught_up() and client.connected, "following the epoch-5 master")
        assert client.truncations > 0
        assert learned == [5]
        assert client.master_epoch == 5
        assert_replica(master, slave, keys=())
        await until(r.acked, "ack")
        assert r.service.in_sync(master.max_phy_offset()) == [7]
        put_many(master, rng, 10, start=100)
        assert r.service.in_sync(master.max_phy_offset()) == []  # not until it holds those too
