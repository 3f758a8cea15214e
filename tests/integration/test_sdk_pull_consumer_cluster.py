"""The SDK's pull consumer against real name server and broker processes: assign, poll, commit,
seek (by offset and by time), restart from the committed offsets, and subscribe with a group
rebalance."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest

from sdk import (
    ClientStateError,
    IllegalArgumentError,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
)
from tests.integration.helpers import until

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0
Q0 = MessageQueue("Pull", "broker-a", 0)
Q1 = MessageQueue("Pull", "broker-a", 1)


async def drain(consumer: PullConsumer, n: int) -> list[MessageExt]:
    got: list[MessageExt] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < n:
        if time.monotonic() > deadline:
            pytest.fail(f"polled {len(got)} of {n} messages")
        got.extend(await consumer.poll(timeout_ms=200))
    return got


def by_queue(queue_id: int) -> Callable[[Sequence[MessageQueue], Message], MessageQueue]:
    return lambda queues, msg: queues[queue_id]


async def fill(namesrv_addr: str, per_queue: int = 10, prefix: str = "") -> None:
    """``per_queue`` messages in each of Pull's two queues, bodies ``q<queue>-<i>``."""
    async with Producer("p", namesrv_addrs=namesrv_addr, instance_name="filler") as producer:
        await producer.create_topic("Pull", queue_nums=2)
        for q in (0, 1):
            for i in range(per_queue):
                await producer.send(Message("Pull", f"{prefix}q{q}-{i}".encode()), queue_selector=by_queue(q))


def consumer(namesrv_addr: str, name: str = "pc", group: str = "pg") -> PullConsumer:
    return PullConsumer(group, namesrv_addrs=namesrv_addr, instance_name=name, consume_from="FIRST_OFFSET")


@pytest.mark.asyncio
async def test_assign_poll_commit_and_resume_from_the_commit(namesrv_addr: str) -> None:
    await fill(namesrv_addr)
    c = consumer(namesrv_addr)
    c.assign([Q0, Q1])
    await c.start()
    try:
        assert await c.fetch_queues("Pull") == [Q0, Q1]
        got = await drain(c, 20)
        for q in (0, 1):
            mine = [m.body for m in got if m.queue_id == q]
            assert mine == [f"q{q}-{i}".encode() for i in range(10)], "each queue in order"
        assert (c.position(Q0), c.position(Q1)) == (10, 10)
        # Nothing committed yet: the broker says "none", or 0 (RocketMQ's answer for a new group
        # while the queue's first message still exists).
        assert await c.committed(Q0) in (None, 0)
        assert await c.commit() == {Q0: 10, Q1: 10}
        assert (await c.committed(Q0), await c.committed(Q1)) == (10, 10)
    finally:
        await c.shutdown()
    await fill(namesrv_addr, 3, prefix="new-")
    again = consumer(namesrv_addr, name="pc2")
    again.assign([Q0, Q1])
    await again.start()
    try:
        got = await drain(again, 6)
    finally:
        await again.shutdown()
    assert sorted(m.body for m in got) == sorted(f"new-q{q}-{i}".encode() for q in (0, 1) for i in range(3))


@pytest.mark.asyncio
async def test_polled_but_uncommitted_messages_come_back_after_a_restart(namesrv_addr: str) -> None:
    await fill(namesrv_addr, 5)
    c = consumer(namesrv_addr)
    c.assign([Q0])
    await c.start()
    try:
        first = await drain(c, 5)
        await c.commit({Q0: 2})  # only the first two are done
    finally:
        await c.shutdown()
    again = consumer(namesrv_addr, name="pc2")
    again.assign([Q0])
    await again.start()
    try:
        second = await drain(again, 3)
    finally:
        await again.shutdown()
    assert [m.queue_offset for m in first] == [0, 1, 2, 3, 4]
    assert [m.queue_offset for m in second] == [2, 3, 4]


@pytest.mark.asyncio
async def test_seek_moves_the_position_and_discards_what_was_buffered(namesrv_addr: str) -> None:
    await fill(namesrv_addr)
    c = consumer(namesrv_addr)
    c.assign([Q0])
    with pytest.raises(ClientStateError):
        c.seek(Q0, 3)
    await c.start()
    try:
        await drain(c, 10)
        c.seek(Q0, 3)
        again = await drain(c, 7)
        assert [m.queue_offset for m in again] == list(range(3, 10))
        assert c.position(Q0) == 10
        with pytest.raises(IllegalArgumentError, match="not assigned"):
            c.seek(Q1, 0)
        # Seek while messages are buffered: the buffered ones are never handed out.
        c.seek(Q0, 0)
        await until(lambda: c._ready.qsize() > 0, "a buffered batch")
        c.seek(Q0, 8)
        after = await drain(c, 2)
        assert [m.queue_offset for m in after] == [8, 9]
        assert await c.seek_to_end(Q0) == 10
        assert await c.poll(timeout_ms=300) == []
        assert await c.seek_to_begin(Q0) == 0
        assert [m.queue_offset for m in await drain(c, 10)] == list(range(10))
    finally:
        await c.shutdown()


@pytest.mark.asyncio
async def test_seek_to_timestamp_finds_the_first_message_stored_at_or_after_it(namesrv_addr: str) -> None:
    await fill(namesrv_addr, 5)
    start = time.time()
    await until(lambda: time.time() - start >= 0.01, "a later millisecond than every message above")
    ts = int(time.time() * 1000)
    await fill(namesrv_addr, 5, prefix="late-")
    c = consumer(namesrv_addr)
    c.assign([Q1])
    await c.start()
    try:
        assert await c.seek_to_timestamp(Q1, ts) == 5
        got = await drain(c, 5)
    finally:
        await c.shutdown()
    assert [m.body for m in got] == [f"late-q1-{i}".encode() for i in range(5)]
    assert all(m.store_timestamp_ms >= ts for m in got)


@pytest.mark.asyncio
async def test_subscribed_pull_consumers_share_the_queues_of_a_group(namesrv_addr: str) -> None:
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        await producer.create_topic("Shared", queue_nums=4)
        a = PullConsumer("sg", namesrv_addrs=namesrv_addr, instance_name="a", consume_from="FIRST_OFFSET",
                         rebalance_interval_ms=1000, heartbeat_interval_ms=1000)  # fmt: skip
        b = PullConsumer("sg", namesrv_addrs=namesrv_addr, instance_name="b", consume_from="FIRST_OFFSET",
                         rebalance_interval_ms=1000, heartbeat_interval_ms=1000)  # fmt: skip
        a.subscribe("Shared", "keep")
        b.subscribe("Shared", "keep")
        with pytest.raises(ClientStateError):
            a.assign([MessageQueue("Shared", "broker-a", 0)])
        await a.start()
        await b.start()
        try:
            await until(
                lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2 and not a.assignment() & b.assignment(),
                "the two members to split four queues",
            )
            for i in range(40):
                await producer.send(Message("Shared", b"%d" % i, tags="keep" if i % 2 == 0 else "drop"))
            got_a: list[MessageExt] = []
            got_b: list[MessageExt] = []

            async def both() -> bool:
                got_a.extend(await a.poll(timeout_ms=50))
                got_b.extend(await b.poll(timeout_ms=50))
                return len(got_a) + len(got_b) >= 20

            await until(both, "the 20 messages tagged 'keep'")
        finally:
            await a.shutdown()
            await b.shutdown()
    assert sorted(m.body for m in got_a + got_b) == sorted(b"%d" % i for i in range(0, 40, 2))
    assert not {m.message_queue for m in got_a} & {m.message_queue for m in got_b}, "no queue read by both"
    assert got_a
    assert got_b
