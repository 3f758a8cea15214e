"""A diverged slave rejoining its master, with real broker processes and 1 GiB CommitLog files:
its handshake cuts the records the master never had while its event loop keeps answering — no
stall of 100 ms or more (``loopStallMaxMs``), where cutting a few records used to read the rest
of the GiB file on the loop (docs/ha.md, "Divergence: the exact rule")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store import Message as StoreMessage
from data_plane.store import MessageStore, PutMessageStatus, StoreConfig
from sdk import Message, Producer, SendStatus
from sdk.admin import AdminClient, decode_records
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOPIC = "Rejoin"
GIB = 1024 * 1024 * 1024
# Both ends: 1 GiB files (fallocated, not written: cheap on disk), no next file made ahead.
BIG_FILES = ["--store-set", f"commit_log_file_size_bytes={GIB}", "--store-set", "preallocate_next_file=false"]
MASTER = ["--role", "ASYNC_MASTER", "--set", "ha_listen=127.0.0.1:0", *BIG_FILES]
SLAVE = ["--role", "SLAVE", "--broker-id", "1", "--set", "ha_listen=127.0.0.1:0", "--set", "register_interval_s=1"]


def slave_store_config(store_dir: Path) -> StoreConfig:
    """The slave broker's store as conftest's SMALL_STORE and BIG_FILES make it."""
    return StoreConfig(
        store_path=str(store_dir / "store"),
        commit_log_file_size_bytes=GIB,
        preallocate_next_file=False,
        reserve_ahead_bytes=0,
        index_hash_slots=65536,
        index_max_entries=262144,
    )


async def found_on(addr: str, key: str) -> int:
    """How many messages of TOPIC the broker at ``addr`` finds by ``key`` (QUERY_MESSAGE)."""
    client = RemotingClient()
    try:
        ext = {"topic": TOPIC, "key": key, "maxNum": "32", "beginTimestamp": "0", "endTimestamp": str(2**62)}
        r = await client.invoke(addr, RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext), 5000)
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            return 0
        assert r.code == ResponseCode.SUCCESS, r.remark
        return len(decode_records(r.body_bytes()))
    finally:
        await client.close()


async def test_a_diverged_slave_rejoins_and_cuts_its_log_without_stalling_its_loop(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    slave_dir = tmp_path / "stores" / "broker-a-s1"
    admin = AdminClient(namesrv.address)
    try:
        master = await asyncio.to_thread(start_broker, namesrv.address, *MASTER)
        slave = await asyncio.to_thread(start_broker, namesrv.address, *SLAVE, *BIG_FILES, store_dir=slave_dir)

        async def caught_up() -> bool:
            m = await admin.broker_status(master.address)
            s = await admin.broker_status(slave.address)
            return s.get("haConnected") == "True" and m["commitLogMaxOffset"] == s["commitLogMaxOffset"]

        async with Producer("rejoin-p", namesrv_addrs=namesrv.address, instance_name="rejoin") as producer:
            await producer.create_topic(TOPIC, queue_nums=2)
            for i in range(300):
                r = await producer.send(Message(TOPIC, b"shared %d " % i * 20, keys=[f"shared-{i}"]))
                assert r.status is SendStatus.SEND_OK
        await until(caught_up, "the slave holding the master's log", timeout_s=30)
        await asyncio.to_thread(slave.stop)
        await asyncio.to_thread(master.stop)

        # The slave's log goes on without the master: records the master never had.
        store = MessageStore(slave_store_config(slave_dir))
        await asyncio.to_thread(store.start)
        try:
            shared_end = store.max_phy_offset()
            for i in range(20):
                msg = StoreMessage(TOPIC, b"diverged %d " % i * 20, i % 2, properties={"KEYS": f"diverged-{i}"})
                put, _end = store.append([msg])
                assert put.status is PutMessageStatus.PUT_OK, put
            diverged_end = store.max_phy_offset()
        finally:
            await asyncio.to_thread(store.shutdown)

        # The slave comes back first (no master to follow yet), then the master: the slave learns
        # it from the name server and its handshake cuts the 20 records.
        slave = await asyncio.to_thread(start_broker, namesrv.address, *SLAVE, *BIG_FILES, store_dir=slave_dir)
        before = await admin.broker_status(slave.address)
        assert int(before["commitLogMaxOffset"]) == diverged_end
        assert await found_on(slave.address, "diverged-3") == 1
        master = await asyncio.to_thread(start_broker, namesrv.address, *MASTER)

        async def cut() -> bool:
            s = await admin.broker_status(slave.address)
            return s.get("haTruncations", "0") != "0" and s.get("haConnected") == "True"

        await until(cut, "the slave's handshake cutting its log", timeout_s=30)
        await until(caught_up, "the slave holding the master's log again", timeout_s=30)
        after = await admin.broker_status(slave.address)
        assert int(after["commitLogMaxOffset"]) == shared_end
        assert await found_on(slave.address, "diverged-3") == 0
        assert await found_on(slave.address, "shared-299") == 1
        assert int(after["loopStallsOver100ms"]) == 0, (before, after)
        assert int(after["loopStallMaxMs"]) < 100, (before, after)
        assert f"truncated from {diverged_end} to {shared_end}" in slave.log_text()
        # The master's next records reach the slave after the cut.
        async with Producer("rejoin-p2", namesrv_addrs=namesrv.address, instance_name="rejoin2") as producer:
            r = await producer.send(Message(TOPIC, b"after the rejoin", keys=["after-rejoin"]))
            assert r.status is SendStatus.SEND_OK
        await until(caught_up, "the slave holding the master's newest record", timeout_s=30)
        assert await found_on(slave.address, "after-rejoin") == 1
    finally:
        await admin.close()
