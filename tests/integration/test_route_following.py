"""Clients follow a topic's queues as they shrink and grow at run time, against real name server
and broker processes: the topic's counts are changed with the broker's admin request the control
plane's reconciler sends (UPDATE_AND_CREATE_TOPIC), the broker registers the change with the
name server at once, and

* a producer sending all along gets no error: a send the broker refuses ("queueId[N] is
  illegal") is retried on a writable queue and the route fetched again at once — not at the
  periodic refresh, 30 s here;
* a push consumer drops queues the route no longer lists without warnings, and takes queues
  added to the route at the next (here 1 s) route refresh, losing no message;
* what a stock RocketMQ client sees — the name server's route, the broker's answer to a send to a
  queue the topic no longer has — reflects the new counts."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.server import Processors
from sdk import Message, Producer, SendResult, protocol
from tests.integration import helpers
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import collecting, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DEADLINE_S = 30.0


def until(cond: Any, what: str, timeout_s: float = DEADLINE_S) -> Any:
    return helpers.until(cond, what, timeout_s)


async def topic_of(cluster: tuple[ServerProcess, ServerProcess], topic: str, queues: int) -> tuple[str, str]:
    """``topic`` made with ``queues`` queues on the cluster's broker: (name server, broker) addresses."""
    namesrv, broker = cluster
    await create_topic(namesrv.address, topic, queues)
    return namesrv.address, broker.address


async def update_topic(broker_addr: str, topic: str, *, read: int, write: int, order: bool = False) -> None:
    """Set ``topic``'s queue counts on a broker, as the control plane's reconciler does."""
    client = RemotingClient(Processors())
    try:
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(read),
            "writeQueueNums": str(write),
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "true" if order else "false",
        }
        resp = await client.invoke(broker_addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=ext))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    finally:
        await client.close()


async def namesrv_counts(namesrv_addr: str, topic: str) -> tuple[int, int]:
    """(readQueueNums, writeQueueNums) of the topic's one broker in the name server's route, as
    a stock client asks for it (GET_ROUTEINFO_BY_TOPIC)."""
    client = RemotingClient(Processors())
    try:
        resp = await client.invoke(namesrv_addr, protocol.route_request(topic))
        data = protocol.parse_route_response(resp, namesrv_addr)
        assert data is not None
        (qd,) = data["queueDatas"]
        return int(qd["readQueueNums"]), int(qd["writeQueueNums"])
    finally:
        await client.close()


class Sending:
    """Senders sending ``topic`` messages until stopped: half with ``send``, half with
    ``send_async`` (its first attempt's fast path, then the coroutine path's retries)."""

    def __init__(self, producer: Producer, topic: str, senders: int = 4) -> None:
        self.producer = producer
        self.topic = topic
        self.results: list[tuple[float, SendResult]] = []
        self.errors: list[BaseException] = []
        self.bodies: list[bytes] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(i)) for i in range(senders)]

    async def _run(self, sender: int) -> None:
        n = 0
        while not self._stop.is_set():
            body = f"{sender}-{n}".encode()
            n += 1
            msg = Message(self.topic, body)
            try:
                if sender % 2:
                    result = await self.producer.send_async(msg)
                else:
                    result = await self.producer.send(msg)
            except Exception as e:
                self.errors.append(e)
                continue
            self.bodies.append(body)
            self.results.append((time.monotonic(), result))

    def queues_since(self, t: float) -> set[int]:
        return {r.message_queue.queue_id for at, r in self.results if at >= t}

    def sent_since(self, t: float) -> int:
        return sum(1 for at, _ in self.results if at >= t)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def queue_ids(mqs: Any) -> set[int]:
    return {mq.queue_id for mq in mqs if not mq.topic.startswith("%RETRY%")}


async def test_shrinking_write_queues_costs_the_producer_no_error_and_consumers_drop_gone_queues(
    cluster: tuple[ServerProcess, ServerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    topic = "Shrinking"
    namesrv, broker = await topic_of(cluster, topic, 8)
    consumer, got = collecting("followers", namesrv, topic, "consumer")
    caplog.set_level(logging.INFO, logger="sdk")
    # The periodic refresh is 30 s away all test long: what follows the change is the refusal.
    async with Producer("shrinking", namesrv_addrs=namesrv) as producer, consumer:
        sending = Sending(producer, topic)
        try:
            await until(lambda: queue_ids(r.message_queue for _, r in sending.results) == set(range(8)), "all 8 queues")
            await update_topic(broker, topic, read=8, write=4)
            changed = time.monotonic()
            inst = producer.instance
            # The route is fetched again at once: the name server's own (writeQueueNums 4), not only
            # the cached one trimmed by the refusal.
            await until(
                lambda: inst.routes[topic].raw["queueDatas"][0]["writeQueueNums"] == 4, "the refreshed route", 5.0
            )
            assert time.monotonic() - changed < 5.0
            assert queue_ids(inst.routes[topic].publish_queues) == {0, 1, 2, 3}
            settled = time.monotonic()
            await until(lambda: sending.sent_since(settled) >= 400, "400 sends after the change")
        finally:
            await sending.stop()
        assert sending.errors == []
        assert sending.queues_since(settled) == {0, 1, 2, 3}
        assert inst.route_refresh.asked <= 3, "one route refresh per topic per interval, not one per refusal"
        # Sends to the read-only queues before the refresh were stored in writable ones, not refused.
        refused = [r for r in caplog.records if "is illegal" in r.getMessage() and r.name == "sdk.producer"]
        assert refused == [], [r.getMessage() for r in refused]

        # The consumer read all 8 queues (readQueueNums stayed 8): everything sent arrives.
        await until(lambda: {m.body for m in got} >= set(sending.bodies), "every message consumed")
        assert queue_ids(consumer.assignment()) == set(range(8))
        # The drained queues go: readQueueNums 4. The consumer drops queues 4..7, quietly.
        caplog.clear()
        await update_topic(broker, topic, read=4, write=4)
        await until(lambda: queue_ids(consumer.assignment()) == {0, 1, 2, 3}, "queues 4..7 dropped", 5.0)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("sdk")]
        assert warnings == [], [r.getMessage() for r in warnings]


async def test_queues_grown_are_used_by_the_producer_and_consumed_within_the_refresh_interval(
    cluster: tuple[ServerProcess, ServerProcess],
) -> None:
    topic = "Growing"
    namesrv, broker = await topic_of(cluster, topic, 4)
    refresh_ms = 1000
    consumer, got = collecting("followers", namesrv, topic, "consumer", route_refresh_interval_ms=refresh_ms)
    async with (
        Producer("growing", namesrv_addrs=namesrv, route_refresh_interval_ms=refresh_ms) as producer,
        consumer,
    ):
        sending = Sending(producer, topic)
        try:
            await until(lambda: len(sending.results) >= 100, "100 sends on 4 queues")
            assert queue_ids(r.message_queue for _, r in sending.results) == {0, 1, 2, 3}
            await update_topic(broker, topic, read=8, write=8)
            grown = time.monotonic()
            # Within the refresh interval (and a rebalance), with some slack for a loaded machine.
            within_s = 3 * refresh_ms / 1000 + 2
            await until(lambda: sending.queues_since(grown) == set(range(8)), "sends to all 8 queues", within_s)
            await until(lambda: queue_ids(consumer.assignment()) == set(range(8)), "the consumer on 8 queues", within_s)
            await until(lambda: {m.queue_id for m in got} == set(range(8)), "consumed from 8", within_s)
        finally:
            await sending.stop()
        assert sending.errors == []
        await until(lambda: {m.body for m in got} >= set(sending.bodies), "every message consumed")


async def test_the_name_server_and_broker_answer_stock_clients_with_the_new_counts(
    cluster: tuple[ServerProcess, ServerProcess],
) -> None:
    topic = "Counted"
    namesrv, broker = await topic_of(cluster, topic, 8)
    assert await namesrv_counts(namesrv, topic) == (8, 8)
    await update_topic(broker, topic, read=8, write=4)
    changed = time.monotonic()
    # The broker registers at once on a topic change (its periodic registration is 30 s apart).
    counts: list[tuple[int, int]] = []

    async def shrunk() -> bool:
        counts.append(await namesrv_counts(namesrv, topic))
        return counts[-1] == (8, 4)

    await until(shrunk, "the name server's route with writeQueueNums 4", 2.0)
    assert time.monotonic() - changed < 2.0

    # A stale client's send to queue 6 (read-only now) is stored in writable queue 6 % 4 = 2, and
    # the answer says so; one to queue 9 (gone) is refused with RocketMQ's code and remark, then
    # what the queue is. On an ordered topic a read-only queue refuses too: moving a message to
    # another queue would break its order.
    client = RemotingClient(Processors())

    async def send(t: str, queue_id: int) -> RemotingCommand:
        cmd = protocol.send_request(
            group="stock", msg=Message(t, b"stale"), queue_id=queue_id, unique_id="", born_timestamp_ms=0
        )
        return await client.invoke(broker, cmd)

    try:
        stored, gone = await send(topic, 6), await send(topic, 9)
        await topic_of(cluster, "CountedInOrder", 8)
        await update_topic(broker, "CountedInOrder", read=8, write=4, order=True)
        ordered = await send("CountedInOrder", 6)
    finally:
        await client.close()
    assert stored.code == ResponseCode.SUCCESS, stored.remark
    assert (stored.ext_fields or {})["queueId"] == "2"
    for queue_id, state, answer in ((9, "gone", gone), (6, "read-only", ordered)):
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark is not None
        assert answer.remark.startswith(f"request queueId[{queue_id}] is illegal, topic[")
        assert f"queue {queue_id} is {state}" in answer.remark
