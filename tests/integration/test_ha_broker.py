"""A broker group of real processes — a SYNC_MASTER and a slave that learns its master from the
name server — on 127.0.0.1: sync double write, slaves that refuse writes and serve reads, the
metadata and offsets the slave keeps, consumers sent to the slave when they read far behind,
and consumers that go on reading (and committing) from the slave while the master is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import ConsumeResult, Message, MessageExt, MessageQueue, Producer, PushConsumer, SendStatus, protocol
from sdk.admin import AdminClient
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOPIC = "HaOrders"
MASTER_FLAGS = ["--role", "SYNC_MASTER", "--set", "ha_listen=127.0.0.1:0", "--set", "ha_sync_timeout_ms=10000"]
SLAVE_FLAGS = ["--role", "SLAVE", "--broker-id", "1", "--set", "ha_listen=127.0.0.1:0"]


@dataclass
class Group:
    namesrv: ServerProcess
    master: ServerProcess
    slave: ServerProcess
    admin: AdminClient
    start: Callable[..., ServerProcess]

    async def status(self, addr: str) -> dict[str, str]:
        return await self.admin.broker_status(addr)

    async def topic_on_slave(self, topic: str) -> None:
        """Metadata reaches a slave within a second of a change (docs/ha.md)."""
        client = RemotingClient()
        try:

            async def there() -> bool:
                t = await client.invoke(self.slave.address, RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG), 5000)
                return f'"{topic}"'.encode() in t.body_bytes()

            await until(there, f"topic {topic} in the slave's topic table", timeout_s=10)
        finally:
            await client.close()

    async def caught_up(self) -> None:
        async def same() -> bool:
            m = await self.status(self.master.address)
            s = await self.status(self.slave.address)
            return m["commitLogMaxOffset"] == s["commitLogMaxOffset"]

        await until(same, "the slave's CommitLog reaches the master's end", timeout_s=20)


def start_slave(start_broker: Callable[..., ServerProcess], tmp_path: Path, namesrv: str, *extra: str) -> ServerProcess:
    """Broker name broker-a (the master's group), a store of its own."""
    return start_broker(namesrv, *SLAVE_FLAGS, *extra, store_dir=tmp_path / "stores" / "broker-a-s1")


@pytest_asyncio.fixture(name="group")
async def group_fixture(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> AsyncIterator[Group]:
    master = await asyncio.to_thread(start_broker, namesrv.address, *MASTER_FLAGS)
    slave = await asyncio.to_thread(start_slave, start_broker, tmp_path, namesrv.address)
    admin = AdminClient(namesrv.address)
    g = Group(namesrv, master, slave, admin, start_broker)
    try:
        await until(lambda: _connected(g), "the slave replicating from the master", timeout_s=20)
        yield g
    finally:
        await admin.close()


async def _connected(g: Group) -> bool:
    st = await g.status(g.slave.address)
    return st.get("haConnected") == "True"


async def send_all(namesrv: str, n: int, *, prefix: str = "m") -> list[tuple[SendStatus, str, bytes]]:
    out = []
    async with Producer("ha-p", namesrv_addrs=namesrv, instance_name=f"ha-{prefix}") as producer:
        await producer.create_topic(TOPIC, queue_nums=2)
        for i in range(n):
            body = f"{prefix}-{i}".encode() * 8
            r = await producer.send(Message(TOPIC, body, keys=[f"{prefix}-{i}"]))
            out.append((r.status, r.offset_msg_id, body))
    return out


async def test_sync_master_answers_after_the_slave_has_the_bytes(group: Group) -> None:
    sent = await send_all(group.namesrv.address, 40)
    assert {s for s, _, _ in sent} == {SendStatus.SEND_OK}
    # Every acknowledged message is on the slave already: no waiting for it to catch up.
    client = RemotingClient()
    try:
        for status, offset_id, body in sent[-5:]:
            assert status is SendStatus.SEND_OK
            cmd = RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": str(int(offset_id[-16:], 16))})
            r = await client.invoke(group.slave.address, cmd, 5000)
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert body in r.body_bytes()
    finally:
        await client.close()
    m = await group.status(group.master.address)
    assert m["brokerRole"] == "SYNC_MASTER"
    assert int(m["haSlaves"]) == 1
    assert int(m["haLagBytes"]) >= 0


async def test_the_slave_refuses_writes_and_keeps_the_masters_metadata(group: Group) -> None:
    await send_all(group.namesrv.address, 3)
    client = RemotingClient()
    try:
        cmd = protocol.send_request(
            group="g", msg=Message(TOPIC, b"to the slave"), queue_id=0, unique_id="U1", born_timestamp_ms=1
        )
        r = await client.invoke(group.slave.address, cmd, 5000)
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "slave" in (r.remark or "")
        await group.topic_on_slave(TOPIC)
    finally:
        await client.close()
    await group.caught_up()


async def test_consumers_read_from_the_slave_while_the_master_is_down(group: Group) -> None:
    sent = await send_all(group.namesrv.address, 30, prefix="before")
    assert {st for st, _, _ in sent} == {SendStatus.SEND_OK}
    await group.caught_up()
    await group.topic_on_slave(TOPIC)
    got: dict[bytes, int] = {}

    async def handle(msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            got[m.body] = got.get(m.body, 0) + 1
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        "ha-readers", namesrv_addrs=group.namesrv.address, instance_name="ha-c", consume_from="FIRST_OFFSET",
        persist_interval_ms=200, pull_retry_delay_ms=100,
    )  # fmt: skip
    consumer.subscribe(TOPIC, "*")
    consumer.on_message(handle)
    group.master.kill()  # kill -9: the consumer starts with only the slave to read from
    await consumer.start()
    try:
        await until(lambda: all(b in got for _, _, b in sent), "every message consumed from the slave", timeout_s=30)

        async def committed_on_slave() -> bool:
            a = AdminClient(group.namesrv.address)
            try:
                rows = await a.group_progress("ha-readers", TOPIC)
            finally:
                await a.close()
            return bool(rows) and sum(r.consumer_offset for r in rows) == len(sent)

        await until(committed_on_slave, "offsets committed on the slave", timeout_s=20)
    finally:
        await consumer.shutdown()
    # The master comes back: the offsets committed on the slave while it was away reach it.
    master = await asyncio.to_thread(group.start, group.namesrv.address, *MASTER_FLAGS)
    group.master = master
    client = RemotingClient()
    try:

        async def master_has_offsets() -> bool:
            total = 0
            for q in (0, 1):
                cmd = RemotingCommand(
                    RequestCode.QUERY_CONSUMER_OFFSET,
                    ext_fields={"consumerGroup": "ha-readers", "topic": TOPIC, "queueId": str(q)},
                )
                r = await client.invoke(master.address, cmd, 5000)
                if r.code != ResponseCode.SUCCESS:
                    return False
                total += int((r.ext_fields or {}).get("offset", "0"))
            return total == len(sent)

        await until(master_has_offsets, "the slave's offsets back on the master", timeout_s=20)
    finally:
        await client.close()


async def test_a_consumer_far_behind_is_sent_to_the_slave(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # "Far behind" = more than 64 KiB behind the write point here (the seed's 40% of RAM).
    master = await asyncio.to_thread(
        start_broker, namesrv.address, *MASTER_FLAGS, "--store-set", "hot_data_bytes=65536"
    )
    await asyncio.to_thread(start_slave, start_broker, tmp_path, namesrv.address)
    admin = AdminClient(namesrv.address)
    client = RemotingClient()
    try:

        async def slave_connected() -> bool:
            return int((await admin.broker_status(master.address)).get("haSlaves", "0")) == 1

        await until(slave_connected, "the slave connected", timeout_s=20)
        async with Producer("far-p", namesrv_addrs=namesrv.address, instance_name="far") as producer:
            await producer.create_topic("HaFar", queue_nums=1)
            for i in range(300):
                r = await producer.send(Message("HaFar", b"x" * 1024 + str(i).encode()))
                assert r.status is SendStatus.SEND_OK

        async def suggestion(offset: int) -> str:
            cmd = protocol.pull_request(
                group="far-g", mq=MessageQueue("HaFar", "broker-a", 0), offset=offset, max_nums=4,
                subscription="*", sub_version=0, suspend_timeout_ms=0, commit_offset=0, suspend=False,
                expression_type="TAG",
            )  # fmt: skip
            r = await client.invoke(master.address, cmd, 5000)
            assert r.code == ResponseCode.SUCCESS, r.remark
            return (r.ext_fields or {})["suggestWhichBrokerId"]

        assert await suggestion(0) == "1"  # ~300 KiB behind: read from the slave next
        assert await suggestion(296) == "0"  # the newest messages: stay on the master
    finally:
        await client.close()
        await admin.close()
