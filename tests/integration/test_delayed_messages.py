"""Delayed (DELAY levels) and timed (TIMER_DELIVER_MS …) messages against real name server and
broker processes: the SDK and a stock RocketMQ client, retry and tenant topics, the 7-day limit,
a clean restart, and kill -9 of the broker at a random moment with timers pending.

Brokers run with ``message_delay_level = "1s 2s 3s"`` so that levels take seconds, a 50 ms tick
and a 200 ms checkpoint interval."""

from __future__ import annotations

import asyncio
import json
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import IllegalMessageError, Message, MessageExt, MessageQueue, Producer, PullConsumer
from tests.integration import test_thirdparty_client as tp

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration

LEVELS_MS = (1000, 2000, 3000)
SCHEDULE_FLAGS = [
    "--set",
    "message_delay_level=1s 2s 3s",
    "--set",
    "schedule_tick_ms=50",
    "--set",
    "schedule_checkpoint_interval_ms=200",
]
# Delivery is never early; on a running broker it is at most 1 s (timer precision) + a tick late.
# A loaded test machine may add its own stall on top.
LATE_SLACK_MS = 2500
DEADLINE_S = 30.0
QUEUES = 4  # every test topic's


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def runtime(addr: str) -> dict[str, str]:
    client = RemotingClient()
    try:
        r = await client.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), 5000)
    finally:
        await client.close()
    assert r.code == ResponseCode.SUCCESS, r.remark
    table: dict[str, str] = json.loads(r.body_bytes())["table"]
    return table


async def collect(
    namesrv: str, topics: list[str], *, expect: int, idle_s: float = 1.0, group: str = "delay-check"
) -> list[MessageExt]:
    """Every message of ``topics`` (QUEUES queues on broker-a, from the first offset): polls
    until ``expect`` arrived and then ``idle_s`` passed without another, or the deadline."""
    consumer = PullConsumer(group, namesrv_addrs=namesrv, instance_name=group, consume_from="FIRST_OFFSET")
    consumer.assign([MessageQueue(t, "broker-a", q) for t in topics for q in range(QUEUES)])
    await consumer.start()
    got: list[MessageExt] = []
    deadline = time.monotonic() + DEADLINE_S
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = await consumer.poll(timeout_ms=200)
            if batch:
                got.extend(batch)
                last = time.monotonic()
            elif len(got) >= expect and time.monotonic() - last >= idle_s:
                break
    finally:
        await consumer.shutdown()
    return got


def assert_on_time(m: MessageExt, due_ms: int) -> None:
    assert m.store_timestamp_ms >= due_ms, f"{m.body!r} delivered {due_ms - m.store_timestamp_ms} ms early"
    assert m.store_timestamp_ms <= due_ms + LATE_SLACK_MS, f"{m.body!r} {m.store_timestamp_ms - due_ms} ms late"


@pytest.mark.asyncio
async def test_delay_levels_and_timers_reach_every_kind_of_topic_on_time(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    start_broker(namesrv.address, *SCHEDULE_FLAGS)
    topics = ["Delayed", "%RETRY%delay-group", "acme%orders"]
    due: dict[bytes, int] = {}
    async with Producer("delay-producer", namesrv_addrs=namesrv.address) as producer:
        for topic in topics:
            await producer.create_topic(topic, queue_nums=QUEUES)
        sent_at = _now_ms()
        for topic in topics:
            for level in (1, 2, 3, 18):  # 18 is past the broker's three levels: the last one
                body = f"{topic}/level-{level}".encode()
                r = await producer.send(Message(topic, body, tags="t", delay_level=level))
                due[body] = sent_at + LEVELS_MS[min(level, 3) - 1]
                assert r.msg_id
            for ahead_ms in (1200, 2600):
                body = f"{topic}/at+{ahead_ms}".encode()
                due[body] = _now_ms() + ahead_ms
                await producer.send(Message(topic, body, deliver_at_ms=due[body]))
            body = f"{topic}/past".encode()
            due[body] = 0
            await producer.send(Message(topic, body, deliver_at_ms=_now_ms() - 5000))  # at once
        with pytest.raises(IllegalMessageError, match="timer_max_delay_s"):
            await producer.send(Message("Delayed", b"too-far", deliver_at_ms=_now_ms() + 8 * 86_400_000))
    got = await collect(namesrv.address, topics, expect=len(due))
    counts = Counter(m.body for m in got)
    assert sorted(counts) == sorted(due), set(due) ^ set(counts)
    assert set(counts.values()) == {1}, [b for b, n in counts.items() if n > 1]
    for m in got:
        assert "DELAY" not in m.properties
        if due[m.body]:
            # The level's delay counts from the store time of the send: never before sent_at + delay.
            assert_on_time(m, due[m.body])
            assert "TIMER_DELIVER_MS" not in m.properties  # a delivered timer's request is consumed
        else:
            assert "TIMER_OUT_MS" not in m.properties  # due already: sent as a plain message
        assert m.topic == m.properties.get("REAL_TOPIC", m.topic)


@pytest.mark.asyncio
async def test_pending_messages_survive_a_clean_restart(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    broker = start_broker(namesrv.address, *SCHEDULE_FLAGS)
    due: dict[bytes, int] = {}
    async with Producer("restart-producer", namesrv_addrs=namesrv.address) as producer:
        await producer.create_topic("Restarted", queue_nums=QUEUES)
        for i in range(10):
            body = f"t{i}".encode()
            due[body] = _now_ms() + 1500 + 200 * i
            await producer.send(Message("Restarted", body, deliver_at_ms=due[body]))
            body = f"d{i}".encode()
            due[body] = _now_ms() + 3000
            await producer.send(Message("Restarted", body, delay_level=3))
    assert broker.stop() == 0
    await asyncio.sleep(0)
    broker = start_broker(namesrv.address, *SCHEDULE_FLAGS)
    got = await collect(namesrv.address, ["Restarted"], expect=len(due))
    assert sorted(m.body for m in got) == sorted(due)
    for m in got:
        assert m.store_timestamp_ms >= due[m.body]
    info = await runtime(broker.address)
    assert info["scheduleDuplicatesSkipped"] == "0"


@pytest.mark.asyncio
@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_kill_9_with_timers_pending_loses_and_duplicates_nothing(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], flush: str
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    flags = [*SCHEDULE_FLAGS, "--store-set", f"flush_disk_type={flush}"]
    broker = start_broker(namesrv.address, *flags)
    kill_after_s = rnd.uniform(1.2, 3.0)  # after the first levels began to fire
    due: dict[bytes, int] = {}  # acknowledged sends → when they are due
    unknown: set[bytes] = set()  # sends in flight at the kill: stored or not
    async with Producer(
        "crash-producer", namesrv_addrs=namesrv.address, retry_times=0, send_timeout_ms=2000
    ) as producer:
        await producer.create_topic("Crashed", queue_nums=QUEUES)
        began = time.monotonic()
        i = 0
        while time.monotonic() - began < kill_after_s:
            body = f"m{i}".encode()
            if rnd.random() < 0.5:
                level = rnd.randint(1, 3)
                msg = Message("Crashed", body, delay_level=level)
                at = _now_ms() + LEVELS_MS[level - 1]
            else:
                at = _now_ms() + rnd.randint(300, 5000)
                msg = Message("Crashed", body, deliver_at_ms=at)
            await producer.send(msg)
            due[body] = at
            i += 1
            if i % 20 == 0:
                await asyncio.sleep(0.01)
        # The kill lands while a send is on the wire.
        body = f"m{i}".encode()
        in_flight = asyncio.ensure_future(producer.send(Message("Crashed", body, deliver_at_ms=_now_ms() + 1000)))
        await asyncio.sleep(rnd.uniform(0, 0.003))
        broker.kill()
        unknown.add(body)
        try:
            await in_flight
            due[body] = _now_ms()
            unknown.discard(body)
        except Exception:  # the broker died first: the send's fate is unknown
            pass
    killed_at = _now_ms()
    pending_at_kill = sum(1 for at in due.values() if at > killed_at)
    print(f"killed after {kill_after_s:.2f} s: {len(due)} acknowledged, {pending_at_kill} still pending")
    assert pending_at_kill > 0
    broker = start_broker(namesrv.address, *flags)
    restarted_at = _now_ms()
    got = await collect(namesrv.address, ["Crashed"], expect=len(due), idle_s=1.5)
    counts = Counter(m.body for m in got)
    missing = sorted(set(due) - set(counts))
    duplicates = {b: n - 1 for b, n in counts.items() if n > 1}
    stray = set(counts) - set(due) - unknown
    print("\n".join(line for line in broker.log_text().splitlines() if "schedule recovery" in line))
    info = await runtime(broker.address)
    print(
        f"delivered {len(counts)} distinct of {len(due)} acknowledged (+{len(unknown)} unknown), "
        f"missing {len(missing)}, duplicates {sum(duplicates.values())}, "
        f"re-puts recognised after the crash {info.get('scheduleDuplicatesSkipped')}"
    )
    assert not missing, f"lost: {missing[:20]} (seed {seed})"
    assert not stray, stray
    assert not duplicates, f"duplicated: {duplicates} (seed {seed})"  # exactly once, also across the crash
    for m in got:
        if m.body in due:
            assert m.store_timestamp_ms >= due[m.body], f"{m.body!r} early (seed {seed})"
            # Due while the broker was down: delivered as soon as it was back.
            assert m.store_timestamp_ms <= max(due[m.body], restarted_at) + LATE_SLACK_MS, (m.body, seed)


@pytest.mark.asyncio
@pytest.mark.skipif(
    not (sys.platform == "linux" and platform.machine() == "x86_64"),
    reason="the third-party client bundles a linux x86_64 librocketmq.so",
)
async def test_a_stock_rocketmq_client_sends_delayed_and_timed_messages(
    tmp_path: Path, namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    start_broker(namesrv.address, *tp.BROKER_FLAGS, *SCHEDULE_FLAGS)
    client = tp.Client(tp.CVS, namesrv.address, tmp_path, None)
    async with Producer("stock-setup", namesrv_addrs=namesrv.address) as producer:
        await producer.create_topic("StockDelayed", queue_nums=QUEUES)
    sent_at = _now_ms()
    specs: list[dict[str, Any]] = [
        {"body": f"level-{i}", "tags": "t", "keys": f"k{i}", "props": {tp.PROP: str(i)}, "delay_level": 2}
        for i in range(3)
    ]
    specs.append(
        {
            "body": "aliyun",
            "tags": "t",
            "keys": "ka",
            "props": {tp.PROP: "a", "__STARTDELIVERTIME": str(sent_at + 1500)},
        }
    )
    specs.append({"body": "timer", "tags": "t", "keys": "kt", "props": {tp.PROP: "t", "TIMER_DELAY_SEC": "1"}})
    client.produce("StockDelayed", specs)
    msgs = client.push("StockDelayed", "stock-delay-group", expect=len(specs))
    assert sorted(m["props"][tp.PROP] for m in msgs) == ["0", "1", "2", "a", "t"]
    got = await collect(namesrv.address, ["StockDelayed"], expect=len(specs))
    for m in got:
        due = sent_at + (1500 if m.body == b"aliyun" else 1000 if m.body == b"timer" else LEVELS_MS[1])
        assert m.store_timestamp_ms >= due, m
