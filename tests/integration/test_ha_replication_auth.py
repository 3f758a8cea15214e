"""The HA link's authentication between an HAService and HAClients in this process over TCP on
127.0.0.1: members with the group's secret replicate; a wrong secret, a slave without one, a peer
that says nothing and a master without a secret yet are refused (counted by reason) and never
count as a slave; a slave with a secret refuses an unauthenticated master (no downgrade); a
secret that arrives later is used by the next connection."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from data_plane.store import MessageStore
from data_plane.store.ha import HAClient, HAService
from data_plane.store.ha.protocol import AUTH_HMAC, CHALLENGE, LinkAuth, decode_challenge
from tests.ha_support import assert_replica, ha_config, put_many
from tests.integration.helpers import until

pytestmark = pytest.mark.asyncio

SECRET = b"the secret of broker-a, 32 bytes"
GROUP = "broker-a"


class Secret:
    """A secret that can be set later (None: not known yet)."""

    def __init__(self, value: bytes | None) -> None:
        self.value = value

    def __call__(self) -> bytes | None:
        return self.value


def auth(secret: bytes | Secret | None, group: str = GROUP, timeout_ms: int = 1000) -> LinkAuth:
    return LinkAuth(group, secret if isinstance(secret, Secret) else Secret(secret), timeout_ms)


@asynccontextmanager
async def master(tmp_path: Path, link: LinkAuth | None) -> AsyncIterator[tuple[MessageStore, HAService]]:
    store = MessageStore(ha_config(str(tmp_path / "master")))
    store.start()
    service = HAService(store, host="127.0.0.1", port=0, poll_interval_ms=10, auth=link)
    await service.start()
    try:
        yield store, service
    finally:
        await service.stop()
        store.shutdown()


@asynccontextmanager
async def slave(tmp_path: Path, port: int, link: LinkAuth | None, name: str = "slave") -> AsyncIterator[HAClient]:
    store = MessageStore(ha_config(str(tmp_path / name)))
    store.start()
    client = HAClient(
        store, "127.0.0.1", port, report_interval_ms=50, reconnect_initial_ms=20, reconnect_max_ms=200, auth=link
    )
    client.start()
    try:
        yield client
    finally:
        await client.stop()
        store.shutdown()


async def test_members_with_the_groups_secret_replicate(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with master(tmp_path, auth(SECRET)) as (store, service), slave(tmp_path, service.port, auth(SECRET)) as c:
        put_many(store, rng, 200)
        service.notify()
        await until(lambda: c.store.max_phy_offset() == store.max_phy_offset(), "caught up")
        await until(lambda: service.max_acked_offset == store.max_phy_offset(), "acked")
        assert_replica(store, c.store)
        assert len(service.connections) == 1
        assert service.is_slave_ok(store.max_phy_offset())
        assert await service.wait_for_slave(store.max_phy_offset(), 1000)
        assert not service.refused
        assert c.auth_failures == 0


@pytest.mark.parametrize(
    ("slave_auth", "reason"),
    [
        (auth(b"another secret, also 32 bytes ok"), "bad_proof"),
        (auth(SECRET, group="broker-b"), "bad_proof"),
        (None, "closed_in_auth"),  # a slave without a secret cannot answer the challenge: it leaves
    ],
)
async def test_a_slave_without_the_groups_secret_is_refused(
    tmp_path: Path, seed: int, slave_auth: LinkAuth | None, reason: str
) -> None:
    rng = random.Random(seed)
    async with master(tmp_path, auth(SECRET, timeout_ms=300)) as (store, service):
        put_many(store, rng, 50)
        async with slave(tmp_path, service.port, slave_auth) as c:
            await until(lambda: service.refused[reason] >= 2, f"refusals ({reason})")
            await until(lambda: c.auth_failures >= 2, "the slave's failures")
            assert not service.connections
            assert c.store.max_phy_offset() == 0  # not one byte of the master's log
            assert not c.connected
            assert not service.is_slave_ok(store.max_phy_offset())
            assert not await service.wait_for_slave(store.max_phy_offset(), 200)


async def test_a_slave_with_a_secret_refuses_an_unauthenticated_master(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with master(tmp_path, None) as (store, service):
        put_many(store, rng, 50)
        async with slave(tmp_path, service.port, auth(SECRET)) as c:
            await until(lambda: c.auth_failures >= 2, "the slave refusing the master")
            assert c.store.max_phy_offset() == 0
            assert not c.connected


async def test_a_peer_that_says_nothing_is_closed_at_the_deadline(tmp_path: Path) -> None:
    async with master(tmp_path, auth(SECRET, timeout_ms=300)) as (_store, service):
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        try:
            mode, _nonce = decode_challenge(await reader.readexactly(CHALLENGE.size))
            assert mode == AUTH_HMAC
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing more sent
        finally:
            writer.close()
        assert service.refused["auth_timeout"] == 1
        assert not service.connections


async def test_a_secret_that_arrives_later_is_used_by_the_next_connection(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    master_secret, slave_secret = Secret(None), Secret(None)
    async with master(tmp_path, auth(master_secret)) as (store, service):
        put_many(store, rng, 50)
        async with slave(tmp_path, service.port, auth(slave_secret)) as c:
            await asyncio.sleep(0.3)
            assert c.connects == 0  # no secret: it does not even connect
            slave_secret.value = SECRET
            c.wake()
            await until(lambda: service.refused["no_secret"] >= 1, "refused by a master without a secret")
            assert c.store.max_phy_offset() == 0
            master_secret.value = SECRET
            await until(lambda: c.store.max_phy_offset() == store.max_phy_offset(), "caught up", timeout_s=10)
            assert len(service.connections) == 1
