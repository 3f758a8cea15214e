"""SQL92 property filters against real name server and broker processes: push and pull consumers
get exactly the matching messages while an unfiltered group of the same topic gets all; a bad
expression is refused at subscribe time (SDK, CHECK_CLIENT_CONFIG, heartbeat, pull) naming the
position; a broker with enable_property_filter=false refuses SQL92; and a kill -9 of the broker
during filtered consumption loses no matching message."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import PULL_FLAG_SUBSCRIPTION, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import IllegalArgumentError, Message, MessageExt, MessageSelector, Producer, PullConsumer, PushConsumer
from sdk.errors import SubscriptionParseFailedError
from sdk.push_consumer import ConsumeResult
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import QUICK, until

pytestmark = pytest.mark.integration

TOPIC = "Filtered"
SQL = "a > 20 AND b = 'x'"


def props(i: int) -> dict[str, str]:
    """Every 7th message has no ``a`` (NULL: never matches); b alternates x / y."""
    p = {"b": "x" if i % 2 else "y"}
    if i % 7:
        p["a"] = str(i)
    return p


def matching(i: int) -> bool:
    p = props(i)
    return "a" in p and int(p["a"]) > 20 and p["b"] == "x"


async def send_range(namesrv_addr: str, lo: int, hi: int, instance: str = "p") -> list[int]:
    sent = []
    async with Producer("pg", namesrv_addrs=namesrv_addr, instance_name=instance) as producer:
        await producer.create_topic(TOPIC, queue_nums=2)
        for i in range(lo, hi):
            await producer.send(Message(TOPIC, f"m{i}".encode(), properties=props(i)))
            sent.append(i)
    return sent


def index(m: MessageExt) -> int:
    return int(m.body.decode()[1:])


def push_consumer(namesrv_addr: str, group: str, name: str, got: list[int], **subscribe: object) -> PushConsumer:
    c = PushConsumer(group, namesrv_addrs=namesrv_addr, instance_name=name, **QUICK)
    c.subscribe(TOPIC, **subscribe)  # type: ignore[arg-type]

    @c.on_message
    def handle(msgs: list[MessageExt]) -> ConsumeResult:
        got.extend(index(m) for m in msgs)
        return ConsumeResult.SUCCESS

    return c


@pytest.mark.asyncio
async def test_filtered_and_unfiltered_groups_of_one_topic(namesrv_addr: str) -> None:
    sent = await send_range(namesrv_addr, 0, 120)
    filtered: list[int] = []
    everything: list[int] = []
    c1 = push_consumer(namesrv_addr, "sqlg", "c1", filtered, expression=MessageSelector.sql(SQL))
    c2 = push_consumer(namesrv_addr, "allg", "c2", everything)
    await c1.start()
    await c2.start()
    try:
        want = {i for i in sent if matching(i)}
        await until(lambda: set(filtered) >= want, "the filtered group got every matching message")
        await until(lambda: set(everything) >= set(sent), "the unfiltered group got every message")
        await asyncio.sleep(0.3)  # anything extra would have arrived with the rest
        assert set(filtered) == want, sorted(set(filtered) - want)
        assert len(want) == 42  # odd i in 21..119, less the multiples of 7 (no a)
    finally:
        await c1.shutdown()
        await c2.shutdown()


@pytest.mark.asyncio
async def test_pull_consumer_with_sql_keyword(namesrv_addr: str) -> None:
    sent = await send_range(namesrv_addr, 0, 60)
    c = PullConsumer("sqlpull", namesrv_addrs=namesrv_addr, instance_name="pc", consume_from="FIRST_OFFSET")
    c.subscribe(TOPIC, sql="a BETWEEN 10 AND 30 AND b IN ('y') AND NOT a = 12")
    await c.start()
    try:
        got: list[int] = []
        want = {i for i in sent if "a" in props(i) and 10 <= i <= 30 and i % 2 == 0 and i != 12}
        deadline = time.monotonic() + 20
        while set(got) != want and time.monotonic() < deadline:
            got.extend(index(m) for m in await c.poll(timeout_ms=200))
        assert set(got) == want
    finally:
        await c.shutdown()


@pytest.mark.asyncio
async def test_a_bad_expression_is_refused_at_subscribe_time_everywhere(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    broker = start_broker(namesrv.address)
    await send_range(namesrv.address, 0, 3)
    c = PushConsumer("badg", namesrv_addrs=namesrv.address, instance_name="bad")
    with pytest.raises(IllegalArgumentError, match="position 9: expected a property name"):
        c.subscribe(TOPIC, MessageSelector.sql("a > 5 AND"))
    bad = {"topic": TOPIC, "subString": "a > 'x'", "expressionType": "SQL92", "tagsSet": [], "codeSet": []}
    client = RemotingClient()
    try:
        body = bodies.dumps({"clientId": "c", "group": "badg", "subscriptionData": bad})
        r = await client.invoke(broker.address, RemotingCommand(RequestCode.CHECK_CLIENT_CONFIG, body=body), 5000)
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "position 4" in (r.remark or "")
        assert "cannot be compared" in (r.remark or "")
        hb = {"clientID": "c", "producerDataSet": [], "consumerDataSet": [
            {"groupName": "badg", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [bad],
             "unitMode": False}]}  # fmt: skip
        r = await client.invoke(broker.address, RemotingCommand(RequestCode.HEART_BEAT, body=bodies.dumps(hb)), 5000)
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "position 4" in (r.remark or "")
        ext = {"consumerGroup": "badg", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "8",
               "sysFlag": str(PULL_FLAG_SUBSCRIPTION), "subscription": "b IN ('x',)",
               "expressionType": "SQL92"}  # fmt: skip
        r = await client.invoke(broker.address, RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext), 5000)
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "position 10" in (r.remark or "")
        ext["subscription"] = "b = 'x'"
        r = await client.invoke(broker.address, RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext), 5000)
        assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), r.remark
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_broker_without_property_filtering_fails_the_consumer_start(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    start_broker(namesrv.address, "--set", "enable_property_filter=false")
    await send_range(namesrv.address, 0, 1)
    c = PushConsumer("offg", namesrv_addrs=namesrv.address, instance_name="off")
    c.subscribe(TOPIC, MessageSelector.sql(SQL))
    c.on_message(lambda msgs: ConsumeResult.SUCCESS)
    with pytest.raises(SubscriptionParseFailedError, match="enable_property_filter"):
        await c.start()
    await c.shutdown()


@pytest.mark.asyncio
async def test_kill_9_during_filtered_consumption_loses_no_matching_message(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    store = tmp_path / "crash-store"
    broker = start_broker(namesrv.address, store_dir=store)
    n = 300 + rng.randrange(100)
    sent = await send_range(namesrv.address, 0, n)
    want = {i for i in sent if matching(i)}
    got: list[int] = []
    c = push_consumer(namesrv.address, "crashg", "cc1", got, sql=SQL)
    c.pull_batch_size = 4  # slow it down: the kill lands mid-way
    await c.start()
    try:
        stop_at = rng.randrange(5, max(6, len(want) // 2))
        await until(lambda: len(got) >= stop_at, "some filtered deliveries before the kill")
        broker.kill()  # kill -9, filtered pulls in flight
    finally:
        await c.shutdown()
    broker = start_broker(namesrv.address, store_dir=store)
    more = await send_range(namesrv.address, n, n + 50, instance="p2")  # after the restart too
    want |= {i for i in more if matching(i)}
    c2 = push_consumer(namesrv.address, "crashg", "cc2", got, sql=SQL)
    await c2.start()
    try:
        await until(lambda: set(got) >= want, "every matching message after the restart", timeout_s=30)
    finally:
        await c2.shutdown()
    assert set(got) == want, f"seed={seed}: non-matching deliveries {sorted(set(got) - want)}"
