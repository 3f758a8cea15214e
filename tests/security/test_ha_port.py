"""Attacks on a broker group's HA port (docs/ha.md, "The HA link"), from outside, against real
broker processes whose link is authenticated by a shared ``ha_secret_file``:

* a peer speaking the old, unauthenticated handshake gets neither CommitLog bytes nor the
  metadata document, and is closed;
* a fake slave with a wrong secret is refused, and so is one replaying a real slave's proof
  captured on the wire (the master's nonce is fresh every connection);
* a fake slave that only REPORTs cannot make a SYNC_MASTER answer SEND_OK;
* a bogus SLAVE_OFFSETS document (offset 1,000,000) from such a peer moves no committed offset
  (a real slave's offsets are clamped to the master's queues: tests/unit/test_ha_link_auth.py);
* the real slave with the right secret replicates and SYNC_MASTER answers SEND_OK, while a
  slave with another secret never links.

The attackers write their own bytes (the layouts of data_plane/store/ha/protocol.py, both the
unauthenticated protocol version 1 and the current version 2) rather than use Orbit's code.
(Named test_ha_port.py: tests/fault/test_ha_link.py holds the module name test_ha_link.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import secrets
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import pytest_asyncio

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import Message, Producer, SendStatus
from sdk.admin import AdminClient
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until

pytestmark = pytest.mark.asyncio

MAGIC = 0x4F524841  # "ORHA"
HANDSHAKE = struct.Struct(">IIqI")  # magic, version, max offset, candidate count
HANDSHAKE_REPLY = struct.Struct(">Iqq")
CHALLENGE_BYTES = 44  # magic, version, mode, 32-byte nonce
DATA_HEADER = struct.Struct(">qI")
REPORT = struct.Struct(">q")
SLAVE_OFFSETS = -2
SYNC_TIMEOUT_MS = 1500
AUTH_TIMEOUT_MS = 1000
GROUP = "broker-a"
TOPIC = "HaSecrets"
NOT_SEND_OK = {SendStatus.SLAVE_NOT_AVAILABLE, SendStatus.FLUSH_SLAVE_TIMEOUT}


def write_secret(path: Path) -> bytes:
    secret = secrets.token_urlsafe(32).encode()
    path.write_bytes(secret + b"\n")
    os.chmod(path, 0o600)
    return secret


def slave_proof(secret: bytes, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    return hmac.new(secret, b"orbit-ha slave" + GROUP.encode() + master_nonce + slave_nonce, hashlib.sha256).digest()


@dataclass
class Secured:
    namesrv: ServerProcess
    master: ServerProcess
    secret: bytes
    secret_file: Path
    admin: AdminClient
    start_broker: Callable[..., ServerProcess]
    tmp: Path
    ha_addr: str = ""  # the master's published HA address

    @property
    def ha(self) -> tuple[str, int]:
        host, _, port = self.ha_addr.rpartition(":")
        return host, int(port)

    async def status(self, addr: str | None = None) -> dict[str, str]:
        return await self.admin.broker_status(addr or self.master.address)

    def slave_flags(self, broker_id: int, secret_file: Path, *extra: str) -> list[str]:
        return [
            "--role", "SLAVE", "--broker-id", str(broker_id), "--set", "ha_listen=127.0.0.1:0",
            "--set", f"ha_secret_file={secret_file}", *extra,
        ]  # fmt: skip

    async def start_slave(self, broker_id: int, secret_file: Path, *extra: str) -> ServerProcess:
        return await asyncio.to_thread(
            self.start_broker, self.namesrv.address, *self.slave_flags(broker_id, secret_file, *extra),
            store_dir=self.tmp / "stores" / f"slave-{broker_id}",
        )  # fmt: skip


@pytest_asyncio.fixture(name="secured")
async def secured_fixture(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> AsyncIterator[Secured]:
    """A SYNC_MASTER whose HA link needs the secret in a 0600 ha_secret_file."""
    secret_file = tmp_path / "ha.secret"
    secret = write_secret(secret_file)
    master = await asyncio.to_thread(
        start_broker, namesrv.address, "--role", "SYNC_MASTER", "--set", "ha_listen=127.0.0.1:0",
        "--set", f"ha_sync_timeout_ms={SYNC_TIMEOUT_MS}", "--set", f"ha_secret_file={secret_file}",
        "--set", f"ha_auth_timeout_ms={AUTH_TIMEOUT_MS}",
    )  # fmt: skip
    admin = AdminClient(namesrv.address)
    s = Secured(namesrv, master, secret, secret_file, admin, start_broker, tmp_path)
    try:
        st = await s.status()
        assert st["haLinkAuth"] == "ha_secret_file"
        s.ha_addr = st["haServerAddr"]
        yield s
        assert secret.decode() not in master.log_text()  # the secret is never logged
    finally:
        await admin.close()


async def send(s: Secured, bodies: list[bytes]) -> list[SendStatus]:
    async with Producer("ha-attack-p", namesrv_addrs=s.namesrv.address, retry_times=0, send_timeout_ms=10_000) as p:
        await p.create_topic(TOPIC, queue_nums=1)
        return [(await p.send(Message(TOPIC, b))).status for b in bodies]


async def read_until_closed(reader: asyncio.StreamReader, timeout_s: float) -> tuple[bytes, bool]:
    """Everything the peer sends until it closes (True) or ``timeout_s`` passes (False)."""
    got = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                got += chunk
    except TimeoutError:
        return bytes(got), False
    except ConnectionError:
        pass
    return bytes(got), True


async def test_the_old_handshake_gets_no_commit_log_and_no_metadata(secured: Secured) -> None:
    marker = b"tenant-body-" + secrets.token_hex(8).encode()
    statuses = await send(secured, [marker * 4])  # stored, though no slave holds it
    assert statuses == [SendStatus.SLAVE_NOT_AVAILABLE]
    for version in (1, 2):  # the unauthenticated protocol, and today's without the proof
        reader, writer = await asyncio.open_connection(*secured.ha)
        try:
            writer.write(HANDSHAKE.pack(MAGIC, version, 0, 0))
            got, closed = await read_until_closed(reader, timeout_s=10)
        finally:
            writer.close()
        print(f"version {version} handshake: {len(got)} bytes back, closed {closed}")
        assert marker not in got
        assert b"topicConfigTable" not in got
        assert b"offsetTable" not in got
        assert len(got) <= CHALLENGE_BYTES  # at most its challenge
        assert closed, "the master keeps an unauthenticated peer's connection"
    st = await secured.status()
    assert st["haSlaves"] == "0"
    assert int(st["haLinkRefused"]) >= 2
    log = secured.master.log_text()
    assert "HA link: refused 127.0.0.1:" in log  # one line a refusal, naming the peer


async def test_a_wrong_secret_and_a_replayed_proof_are_refused(secured: Secured) -> None:
    # A fake slave with its own secret.
    reader, writer = await asyncio.open_connection(*secured.ha)
    try:
        challenge = await asyncio.wait_for(reader.readexactly(CHALLENGE_BYTES), 5)
        nonce = os.urandom(32)
        writer.write(nonce + slave_proof(b"a guess at the secret", challenge[12:], nonce))
        got, closed = await read_until_closed(reader, timeout_s=5)
    finally:
        writer.close()
    assert (got, closed) == (b"", True)  # no master proof, no data: closed

    # The real slave through a proxy that records what it sends; its proof is then replayed.
    proxy = RecordingProxy(*secured.ha)
    await proxy.start()
    try:
        slave = await secured.start_slave(1, secured.secret_file, "--set", f"ha_master_address=127.0.0.1:{proxy.port}")

        async def linked() -> bool:
            return (await secured.status(slave.address)).get("haConnected") == "True"

        await until(linked, "the real slave replicating through the proxy", timeout_s=20)
        assert proxy.first_up is not None
        assert proxy.first_down is not None
        captured_challenge, captured_proof = proxy.first_down[:CHALLENGE_BYTES], bytes(proxy.first_up[:64])
        for _ in range(3):
            reader, writer = await asyncio.open_connection(*secured.ha)
            try:
                challenge = await asyncio.wait_for(reader.readexactly(CHALLENGE_BYTES), 5)
                assert challenge[12:] != captured_challenge[12:]  # a fresh nonce
                writer.write(captured_proof)
                got, closed = await read_until_closed(reader, timeout_s=5)
            finally:
                writer.close()
            assert (got, closed) == (b"", True)
    finally:
        await proxy.close()
    assert int((await secured.status())["haLinkRefused.bad_proof"]) >= 4


async def fake_slave(host: str, port: int, version: int, *, offsets_doc: bytes | None = None) -> None:
    """A peer that handshakes (version 1: straight away; version 2: after reading the challenge,
    which it cannot answer) and REPORTs every byte it is sent as held — and, with
    ``offsets_doc``, sends it as SLAVE_OFFSETS. Runs until the master closes it."""
    reader, writer = await asyncio.open_connection(host, port)
    learned = 0
    try:
        if version == 2:
            await reader.readexactly(CHALLENGE_BYTES)
        writer.write(HANDSHAKE.pack(MAGIC, version, 0, 0))
        if offsets_doc is not None:
            writer.write(REPORT.pack(SLAVE_OFFSETS) + struct.pack(">I", len(offsets_doc)) + offsets_doc)
        _code, learned, _top = HANDSHAKE_REPLY.unpack(await reader.readexactly(HANDSHAKE_REPLY.size))
        while True:
            phy, size = DATA_HEADER.unpack(await reader.readexactly(DATA_HEADER.size))
            if size:
                await reader.readexactly(size)
            if phy >= 0:
                learned = phy + size
            writer.write(REPORT.pack(learned))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, struct.error):
        pass
    finally:
        writer.close()


async def test_a_fake_slave_that_only_reports_gets_no_send_ok(secured: Secured) -> None:
    host, port = secured.ha
    fakes = [asyncio.create_task(fake_slave(host, port, v)) for v in (1, 2, 1, 2)]
    try:
        await asyncio.sleep(0.3)  # the fakes are attached before the sends
        statuses = await send(secured, [f"sync-{i}".encode() for i in range(3)])
    finally:
        for t in fakes:
            t.cancel()
        await asyncio.gather(*fakes, return_exceptions=True)
    print(f"SYNC_MASTER sends with only fake slaves attached: {[s.value for s in statuses]}")
    assert SendStatus.SEND_OK not in statuses
    assert set(statuses) <= NOT_SEND_OK
    assert (await secured.status())["haSlaves"] == "0"


async def test_bogus_slave_offsets_from_an_outsider_move_nothing(secured: Secured) -> None:
    await send(secured, [b"one", b"two"])
    client = RemotingClient()
    ext = {"consumerGroup": "victims", "topic": TOPIC, "queueId": "0"}
    try:
        r = await client.invoke(
            secured.master.address,
            RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={**ext, "commitOffset": "1"}),
            5000,
        )
        assert r.code == ResponseCode.SUCCESS, r.remark
        doc = orjson.dumps({"offsetTable": {f"{TOPIC}@victims": {"0": 1_000_000}}})
        host, port = secured.ha
        fakes = [asyncio.create_task(fake_slave(host, port, v, offsets_doc=doc)) for v in (1, 2)]
        _done, pending = await asyncio.wait(fakes, timeout=AUTH_TIMEOUT_MS / 1000 + 5)
        for t in pending:
            t.cancel()
        r = await client.invoke(
            secured.master.address, RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=ext), 5000
        )
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert (r.ext_fields or {})["offset"] == "1"
        assert not pending, "the master keeps an unauthenticated peer's connection"
    finally:
        await client.close()


async def test_the_real_slave_replicates_and_one_with_another_secret_never_links(secured: Secured) -> None:
    slave = await secured.start_slave(1, secured.secret_file)
    other_file = secured.tmp / "other.secret"
    write_secret(other_file)
    intruder = await secured.start_slave(2, other_file)

    async def linked() -> bool:
        return (await secured.status(slave.address)).get("haConnected") == "True"

    await until(linked, "the slave replicating", timeout_s=20)
    statuses = await send(secured, [f"m-{i}".encode() for i in range(5)])
    assert statuses == [SendStatus.SEND_OK] * 5
    m = await secured.status()
    assert m["haSlaves"] == "1"

    async def intruder_refused() -> bool:
        st = await secured.status(intruder.address)
        return int(st.get("haLinkAuthFailures", "0")) >= 1

    await until(intruder_refused, "the slave with another secret refused", timeout_s=20)
    st = await secured.status(intruder.address)
    assert st["haConnected"] == "False"
    assert st["commitLogMaxOffset"] == "0"
    assert int((await secured.status())["haLinkRefused.bad_proof"]) >= 1


class RecordingProxy:
    """127.0.0.1:<port> forwarded to the master's HA port; the first connection's bytes in each
    direction are recorded (what a wire tap would see)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.first_up: bytearray | None = None
        self.first_down: bytearray | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        up: bytearray | None = None
        down: bytearray | None = None
        if self.first_up is None:
            up, down = bytearray(), bytearray()
            self.first_up, self.first_down = up, down
        pumps = [
            asyncio.create_task(_pump(reader, up_writer, up)),
            asyncio.create_task(_pump(up_reader, writer, down)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for t in pumps:
            t.cancel()
        writer.close()
        up_writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
            with contextlib.suppress(BaseException):
                await t


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: bytearray | None) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            if record is not None and len(record) < 4096:
                record += data
            writer.write(data)
            await writer.drain()
