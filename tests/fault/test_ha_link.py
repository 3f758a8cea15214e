"""A cut replication link (a TCP proxy between slave and master that this test controls): a
SYNC_MASTER answers FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE within its timeout instead of
hanging — never SEND_OK without a copy — and sends are SEND_OK again once the link heals (the
link authenticated by a shared ha_secret_file, through the proxy and again after the cut)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk import Message, Producer, SendStatus
from sdk.admin import AdminClient
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until

pytestmark = [pytest.mark.fault, pytest.mark.asyncio]

SYNC_TIMEOUT_MS = 1500


class LinkProxy:
    """Forwards 127.0.0.1:<port> to a target. ``blackhole()`` keeps the connections open but
    drops every byte (a link that silently stops, the hard case); ``heal()`` closes them so the
    slave reconnects through a working proxy."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.dropping = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for t in pumps:
            t.cancel()
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.dropping:
                continue
            writer.write(data)
            await writer.drain()

    def blackhole(self) -> None:
        self.dropping = True

    def heal(self) -> None:
        self.dropping = False
        for w in list(self._writers):
            w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
            with contextlib.suppress(BaseException):
                await t


async def test_a_cut_link_gets_a_timely_refusal_and_heals(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    secret_file = tmp_path / "ha.secret"
    secret_file.write_text(secrets.token_urlsafe(32))
    os.chmod(secret_file, 0o600)
    master = await asyncio.to_thread(
        start_broker, namesrv.address, "--role", "SYNC_MASTER", "--set", "ha_listen=127.0.0.1:0",
        "--set", f"ha_sync_timeout_ms={SYNC_TIMEOUT_MS}", "--set", f"ha_secret_file={secret_file}",
    )  # fmt: skip
    admin = AdminClient(namesrv.address)
    proxy: LinkProxy | None = None
    try:
        ha_host, _, ha_port = (await admin.broker_status(master.address))["haServerAddr"].rpartition(":")
        proxy = LinkProxy(ha_host, int(ha_port))
        await proxy.start()
        slave = await asyncio.to_thread(
            start_broker, namesrv.address, "--role", "SLAVE", "--broker-id", "1",
            "--set", f"ha_master_address=127.0.0.1:{proxy.port}", "--set", f"ha_secret_file={secret_file}",
            store_dir=tmp_path / "stores" / "slave",
        )  # fmt: skip

        async def linked() -> bool:
            return (await admin.broker_status(slave.address)).get("haConnected") == "True"

        await until(linked, "the slave replicating through the proxy", timeout_s=20)
        async with Producer("link-p", namesrv_addrs=namesrv.address, retry_times=0, send_timeout_ms=10_000) as p:
            await p.create_topic("HaLink", queue_nums=1)
            assert (await p.send(Message("HaLink", b"before"))).status is SendStatus.SEND_OK
            proxy.blackhole()
            statuses = []
            for i in range(3):
                began = time.monotonic()
                r = await p.send(Message("HaLink", f"cut-{i}".encode()))
                took = time.monotonic() - began
                statuses.append(r.status)
                print(f"send while the link is cut: {r.status.value} after {took * 1000:.0f} ms")
                assert took < SYNC_TIMEOUT_MS / 1000 + 2.0  # answered, not hanging
            assert SendStatus.SEND_OK not in statuses
            assert set(statuses) <= {SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SLAVE_NOT_AVAILABLE}
            proxy.heal()

            async def ok_again() -> bool:
                return (await p.send(Message("HaLink", b"healed"))).status is SendStatus.SEND_OK

            await until(ok_again, "SEND_OK once the link is back", timeout_s=30, every_s=0.2)

        # Everything stored while the link was cut reached the slave after it healed.
        async def same_end() -> bool:
            m = await admin.broker_status(master.address)
            s = await admin.broker_status(slave.address)
            return m["commitLogMaxOffset"] == s["commitLogMaxOffset"]

        await until(same_end, "the slave caught up after the cut", timeout_s=20)
    finally:
        if proxy is not None:
            await proxy.close()
        await admin.close()
