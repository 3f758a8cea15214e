"""Batches against a real broker: a batch just under 4 MiB is stored and consumed whole (and its
messages found by key); one over 4 MiB is refused by the broker with a clear error; a kill -9
right after a batch was acknowledged loses none of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sdk import IllegalMessageError, Message, MessageExt, MessageQueue, Producer, PullConsumer
from sdk.admin import AdminClient
from sdk.message import new_unique_id
from sdk.protocol import batch_body
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until

pytestmark = pytest.mark.integration

LIMIT = 4 * 1024 * 1024
TOPIC = "Batches"


def batch_of(total_bytes: int, n: int = 4, tag: str = "big") -> list[Message]:
    """``n`` messages whose batch body is exactly ``total_bytes`` (ids are 32 characters)."""

    def make(size: int) -> list[Message]:
        return [
            Message(TOPIC, bytes([65 + i]) * (size + (1 if i < extra else 0)), keys=[f"{tag}-{i}"]) for i in range(n)
        ]

    extra = 0
    probe = make(1000)
    overhead = len(batch_body(probe, [new_unique_id() for _ in probe])) - 1000 * n
    size, extra = divmod(total_bytes - overhead, n)
    msgs = make(size)
    assert len(batch_body(msgs, [new_unique_id() for _ in msgs])) == total_bytes
    return msgs


async def consume_all(namesrv_addr: str, n: int, group: str) -> list[MessageExt]:
    c = PullConsumer(group, namesrv_addrs=namesrv_addr, instance_name=group, consume_from="FIRST_OFFSET")
    c.assign([MessageQueue(TOPIC, "broker-a", 0)])
    await c.start()
    got: list[MessageExt] = []
    try:

        async def enough() -> bool:
            got.extend(await c.poll(timeout_ms=200))
            return len(got) >= n

        await until(enough, f"{n} messages of the batch")
    finally:
        await c.shutdown()
    return got


async def create(producer: Producer) -> None:
    await producer.create_topic(TOPIC, queue_nums=1)


@pytest.mark.asyncio
async def test_a_batch_just_under_4_mib_is_stored_and_consumed_whole(namesrv_addr: str) -> None:
    msgs = batch_of(LIMIT - 64)
    async with Producer("bp", namesrv_addrs=namesrv_addr, instance_name="bp") as producer:
        await create(producer)
        result = await producer.send_batch(msgs)
    assert len(result.msg_ids) == 4
    got = await consume_all(namesrv_addr, 4, "bg")
    assert [m.body for m in got] == [m.body for m in msgs]
    assert [m.msg_id for m in got] == result.msg_ids
    async with AdminClient([namesrv_addr]) as admin:
        found = await admin.query_by_key(TOPIC, "big-2")
    assert [m.body for m in found] == [msgs[2].body]


@pytest.mark.asyncio
async def test_a_batch_over_4_mib_is_refused_with_a_clear_error(namesrv_addr: str) -> None:
    over = batch_of(LIMIT + 1, tag="over")
    async with Producer("bp", namesrv_addrs=namesrv_addr, instance_name="bp") as producer:
        await create(producer)
        with pytest.raises(IllegalMessageError):  # the SDK refuses it before sending
            await producer.send_batch(over)
    # A client that does not check (stock clients may not): the broker refuses it, saying why.
    async with Producer(
        "bp", namesrv_addrs=namesrv_addr, instance_name="lax", max_message_bytes=8 * LIMIT, retry_times=0
    ) as lax:
        with pytest.raises(IllegalMessageError, match=f"the batch is {LIMIT + 1} bytes, over {LIMIT}"):
            await lax.send_batch(over)
    async with AdminClient([namesrv_addr]) as admin:
        assert await admin.query_by_key(TOPIC, "over-0") == []


@pytest.mark.asyncio
async def test_an_acknowledged_batch_survives_kill_9(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "batch-store"
    broker = start_broker(namesrv.address, store_dir=store)
    msgs = batch_of(LIMIT - 1024, n=8, tag="crash")
    async with Producer("bp", namesrv_addrs=namesrv.address, instance_name="bp") as producer:
        await create(producer)
        await producer.send_batch(msgs)
    broker.kill()
    start_broker(namesrv.address, store_dir=store)
    got = await consume_all(namesrv.address, 8, "crashg")
    assert [m.body for m in got] == [m.body for m in msgs]
