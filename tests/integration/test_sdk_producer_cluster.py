"""The SDK's producer and the blocking facade against real name server and broker processes:
round trip with every field, batches, topic auto-creation, oneway and async sends, ordered
sends, the size limit and a dead name server in the list."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import decode_frame
from data_plane.remoting.connection import Connection
from sdk import (
    BlockingProducer,
    BlockingPullConsumer,
    Message,
    MessageExt,
    MessageQueue,
    MessageTooLargeError,
    Producer,
    PullConsumer,
    SendResult,
    SendStatus,
    StaticToken,
)
from tests.integration.helpers import until

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0


async def drain(consumer: PullConsumer, n: int, timeout_s: float = DEADLINE_S) -> list[MessageExt]:
    """Poll until ``n`` messages arrived (or fail)."""
    got: list[MessageExt] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        if time.monotonic() > deadline:
            pytest.fail(f"received {len(got)} of {n} messages within {timeout_s} s")
        got.extend(await consumer.poll(timeout_ms=200))
    return got


async def pull_all(namesrv_addr: str, topic: str, n: int, group: str = "reader") -> list[MessageExt]:
    consumer = PullConsumer(group, namesrv_addrs=namesrv_addr, consume_from="FIRST_OFFSET", instance_name=group)
    consumer.subscribe(topic)
    await consumer.start()
    try:
        return await drain(consumer, n)
    finally:
        await consumer.shutdown()


@pytest.mark.asyncio
async def test_a_sent_message_comes_back_with_every_field(namesrv_addr: str) -> None:
    before_ms = int(time.time() * 1000)
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        await producer.create_topic("Orders", queue_nums=4)
        msg = Message("Orders", b"\x00payload\xff", tags="paid", keys=["order-1", "user-9"], properties={"k": "v"})
        result = await producer.send(msg)
    assert result.status is SendStatus.SEND_OK
    assert result.message_queue.topic == "Orders"
    assert result.message_queue.broker_name == "broker-a"
    (got,) = await pull_all(namesrv_addr, "Orders", 1)
    assert got.body == b"\x00payload\xff"
    assert (got.tags, got.keys, got.properties["k"]) == ("paid", ("order-1", "user-9"), "v")
    assert got.msg_id == result.msg_id
    assert got.offset_msg_id == result.offset_msg_id
    assert (got.message_queue, got.queue_offset) == (result.message_queue, result.queue_offset)
    assert before_ms <= got.born_timestamp_ms <= got.store_timestamp_ms <= int(time.time() * 1000)
    assert got.reconsume_times == 0


@pytest.mark.asyncio
async def test_a_batch_lands_in_one_queue_in_order_with_one_id_per_message(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        await producer.create_topic("Batch", queue_nums=2)
        msgs = [Message("Batch", f"m{i}".encode(), keys=f"k{i}") for i in range(10)]
        result = await producer.send_batch(msgs)
    assert result.status is SendStatus.SEND_OK
    assert len(result.msg_ids) == 10
    assert len(result.offset_msg_id.split(",")) == 10
    got = await pull_all(namesrv_addr, "Batch", 10)
    assert {m.message_queue for m in got} == {result.message_queue}
    got.sort(key=lambda m: m.queue_offset)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(10)]
    assert [m.queue_offset for m in got] == list(range(result.queue_offset, result.queue_offset + 10))
    assert [m.msg_id for m in got] == result.msg_ids
    assert [m.keys for m in got] == [(f"k{i}",) for i in range(10)]


@pytest.mark.asyncio
async def test_the_first_send_to_an_unknown_topic_creates_it_with_four_queues(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        results = [await producer.send(Message("Fresh", b"%d" % i)) for i in range(8)]
        assert all(r.status is SendStatus.SEND_OK for r in results)

        async def registered() -> bool:
            route = await producer.instance.fetch_route("Fresh")
            return route is not None and len(route.publish_queues) == 4

        await until(registered, "the broker to register the new topic with the name server")
        assert await producer.fetch_publish_queues("Fresh") == [MessageQueue("Fresh", "broker-a", i) for i in range(4)]
    assert len({r.message_queue for r in results}) == 4, "sends are spread round-robin over the queues"


@pytest.mark.asyncio
async def test_one_sharding_key_keeps_its_messages_in_one_queue_in_send_order(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        await producer.create_topic("Sharded", queue_nums=8)
        sent: dict[str, list[SendResult]] = {}
        for i in range(30):
            for key in ("alpha", "beta", "gamma"):
                sent.setdefault(key, []).append(
                    await producer.send(Message("Sharded", f"{key}:{i}".encode()), sharding_key=key)
                )
    for key, results in sent.items():
        assert len({r.message_queue for r in results}) == 1, key
        offsets = [r.queue_offset for r in results]
        assert offsets == sorted(offsets), "send order is queue order"
    got = await pull_all(namesrv_addr, "Sharded", 90)
    for key in sent:
        mine = sorted((m for m in got if m.body.startswith(key.encode())), key=lambda m: m.queue_offset)
        assert [m.body for m in mine] == [f"{key}:{i}".encode() for i in range(30)]


@pytest.mark.asyncio
async def test_oneway_and_async_sends_arrive(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        await producer.create_topic("Mixed", queue_nums=2)
        await producer.send_oneway(Message("Mixed", b"oneway"))
        futures = [producer.send_async(Message("Mixed", b"async-%d" % i)) for i in range(5)]
        results = await asyncio.gather(*futures)
    assert all(r.status is SendStatus.SEND_OK for r in results)
    got = await pull_all(namesrv_addr, "Mixed", 6)
    assert sorted(m.body for m in got) == sorted([b"oneway"] + [b"async-%d" % i for i in range(5)])


@pytest.mark.asyncio
async def test_send_async_frames_laid_out_from_the_template_carry_every_field(
    namesrv_addr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common send_async writes a frame laid out from the group's template
    (``protocol.SendHead``, ``Connection.invoke_frame``); a message with keys takes the command
    path. Both arrive with their tags, user properties (JSON escapes, non-ASCII) and ids."""
    laid_out: list[int] = []
    real = Connection.invoke_frame

    def counted(self: Connection, *args: Any) -> None:  # a spy: the call goes through unchanged
        laid_out.append(args[0])
        real(self, *args)

    monkeypatch.setattr(Connection, "invoke_frame", counted)
    odd = 'quote " backslash \\ tab \t é 漢 😀'
    msgs = [
        Message("Laid", b"plain-%d" % i, tags=["a", "b/c", "é"][i % 3] if i % 4 else None,
                properties={"n": str(i), "odd": odd} if i % 2 else None)
        for i in range(12)
    ]  # fmt: skip
    msgs.append(Message("Laid", b"keyed", tags="k", keys=["key-1"], properties={"odd": odd}))
    async with Producer("p-laid", namesrv_addrs=namesrv_addr) as producer:
        await producer.create_topic("Laid", queue_nums=2)
        await producer.send(Message("Laid", b"warm"))  # the route and the connection known
        laid_out.clear()
        results = await asyncio.gather(*(producer.send_async(m) for m in msgs))
        cancelled = producer.send_async(Message("Laid", b"cancelled"))
        cancelled.cancel()  # before its answer: once the answer is read, no longer in flight
        await until(lambda: not producer._pending, what="the cancelled send leaving the sends in flight")
    assert len(laid_out) == 13, "every message but the keyed one went through the template"
    assert all(r.status is SendStatus.SEND_OK for r in results)
    got = {m.body: m for m in await pull_all(namesrv_addr, "Laid", 15)}  # (the cancelled one was sent)
    for sent, result in zip(msgs, results, strict=True):
        m = got[sent.body]
        assert (m.tags, m.keys, m.msg_id) == (sent.tags, sent.keys, result.msg_id)
        assert {k: v for k, v in m.properties.items() if k in ("n", "odd")} == sent.properties
        assert (m.message_queue, m.queue_offset) == (result.message_queue, result.queue_offset)


@pytest.mark.asyncio
async def test_send_async_with_a_token_lays_each_request_out_with_it_without_a_task(
    namesrv_addr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With credentials whose token needs no fetch, send_async writes each request at once on
    the connection (no task a send), laid out from the group's template with the token's field
    in it (a spy on ``Connection.invoke_frame``; this broker checks no tokens)."""
    signed: list[dict[str, str]] = []
    real = Connection.invoke_frame

    def seen(self: Connection, opaque: int, code: int, head: bytes, body: bytes, *rest: Any) -> None:  # a spy
        if code == RequestCode.SEND_MESSAGE_V2:
            signed.append(dict(decode_frame(memoryview(head + body)[4:]).ext_fields or {}))
        real(self, opaque, code, head, body, *rest)

    monkeypatch.setattr(Connection, "invoke_frame", seen)
    async with Producer("p-token", namesrv_addrs=namesrv_addr, credentials=StaticToken("tok-1")) as producer:
        await producer.create_topic("Signed", queue_nums=2)
        await producer.send(Message("Signed", b"warm"))
        signed.clear()
        tasks_before = len(asyncio.all_tasks())
        futs = [producer.send_async(Message("Signed", b"s-%d" % i, tags="t")) for i in range(5)]
        assert len(signed) == 5, "each request written by send_async itself"
        assert len(asyncio.all_tasks()) == tasks_before, "no task a send"
        results = await asyncio.gather(*futs)
    assert all(f.get("Authorization") == "Bearer tok-1" for f in signed)
    assert all(r.status is SendStatus.SEND_OK for r in results)
    got = await pull_all(namesrv_addr, "Signed", 6)
    assert sorted(m.body for m in got) == sorted([b"warm"] + [b"s-%d" % i for i in range(5)])


@pytest.mark.asyncio
async def test_an_oversized_message_is_refused_by_the_client_and_a_4_mib_one_goes_through(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=namesrv_addr, send_timeout_ms=10000) as producer:
        await producer.create_topic("Big", queue_nums=1)
        with pytest.raises(MessageTooLargeError, match="4194304"):
            await producer.send(Message("Big", b"x" * (4 * 1024 * 1024 + 1)))
        small = await producer.send(Message("Big", b"y" * 1000))
    assert small.status is SendStatus.SEND_OK


@pytest.mark.asyncio
async def test_a_dead_name_server_in_the_list_is_skipped(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=f"127.0.0.1:1;{namesrv_addr}") as producer:
        result = await producer.send(Message("Detour", b"x"))
    assert result.status is SendStatus.SEND_OK


def test_the_blocking_facade_sends_polls_and_commits(namesrv_addr: str) -> None:
    with BlockingProducer("bp", namesrv_addrs=namesrv_addr) as producer:
        producer.create_topic("Blocking", queue_nums=2)
        sent = [producer.send(Message("Blocking", b"b%d" % i)) for i in range(6)]
        sent.append(producer.send_batch([Message("Blocking", b"batch-1"), Message("Blocking", b"batch-2")]))
    assert all(r.status is SendStatus.SEND_OK for r in sent)
    consumer = BlockingPullConsumer("bc", namesrv_addrs=namesrv_addr, consume_from="FIRST_OFFSET")
    queues = consumer.fetch_queues("Blocking")
    assert queues == [MessageQueue("Blocking", "broker-a", 0), MessageQueue("Blocking", "broker-a", 1)]
    consumer.assign(queues)
    with consumer:
        got: list[MessageExt] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 8 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=200))
        committed = consumer.commit()
        assert {consumer.committed(mq) for mq in queues} == set(committed.values())
    assert sorted(m.body for m in got) == sorted([b"b%d" % i for i in range(6)] + [b"batch-1", b"batch-2"])
    assert sum(committed.values()) == 8, "committed offsets are one past the last consumed message"
