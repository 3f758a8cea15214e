"""The broker-side message trace against real processes: a message's timeline (stored → delivered
to a group and client → consumed) by UNIQ_KEY or offset msg id through ``orbit message trace``,
and what survives a kill -9 of the broker with trace writing in flight."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdk import Message, MessageExt, Producer, PushConsumer, SendResult
from sdk.admin import AdminClient
from sdk.push_consumer import ConsumeResult
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import QUICK, orbit, until

pytestmark = pytest.mark.integration

TOPIC = "Traced"
TRACE_ON = ("--set", "trace_enabled=true")


async def send(namesrv_addr: str, n: int, prefix: str, instance: str) -> list[SendResult]:
    async with Producer("tp", namesrv_addrs=namesrv_addr, instance_name=instance) as producer:
        await producer.create_topic(TOPIC, queue_nums=1)
        return [await producer.send(Message(TOPIC, f"{prefix}{i}".encode(), keys=[f"{prefix}{i}"])) for i in range(n)]


def consumer(namesrv_addr: str, name: str, got: list[str]) -> PushConsumer:
    c = PushConsumer("tg", namesrv_addrs=namesrv_addr, instance_name=name, **QUICK)
    c.subscribe(TOPIC)

    @c.on_message
    def handle(msgs: list[MessageExt]) -> ConsumeResult:
        got.extend(m.body.decode() for m in msgs)
        return ConsumeResult.SUCCESS

    return c


async def no_held_pulls(namesrv_addr: str, broker: ServerProcess) -> bool:
    """The broker holds no pull: a shut-down consumer's last long poll is gone with its
    connection, so nothing sent afterwards is delivered to it."""
    async with AdminClient([namesrv_addr]) as admin:
        return (await admin.broker_status(broker.address)).get("heldPullRequests") == "0"


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["event"]) for e in events]


async def trace(namesrv_addr: str, msg_id: str) -> list[dict[str, Any]]:
    async with AdminClient([namesrv_addr]) as admin:
        return await admin.message_trace(TOPIC, msg_id)


@pytest.mark.asyncio
async def test_a_messages_timeline_by_either_id_through_the_cli(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    start_broker(namesrv.address, *TRACE_ON)
    namesrv_addr = namesrv.address
    [r] = await send(namesrv_addr, 1, "m", "p")
    got: list[str] = []
    c = consumer(namesrv_addr, "c1", got)
    await c.start()
    try:
        events: list[dict[str, Any]] = []

        async def consumed() -> bool:
            nonlocal events
            events = await trace(namesrv_addr, r.msg_id)
            return "consumed" in kinds(events)

        await until(consumed, "a consumed event")
    finally:
        await c.shutdown()
    assert kinds(events) == ["stored", "delivered", "consumed"]
    stored, delivered, done = events
    assert stored["producerGroup"] == "tp"
    assert stored["uniqKey"] == r.msg_id
    assert stored["msgId"] == r.offset_msg_id
    assert stored["bornHost"].startswith("127.0.0.1:")
    assert delivered["group"] == "tg"
    assert delivered["clientId"]
    assert delivered["clientAddr"].startswith("127.0.0.1:")
    assert done["group"] == "tg"
    assert done["clientId"] == delivered["clientId"]
    assert stored["time"] <= delivered["time"] <= done["time"]
    assert await trace(namesrv_addr, r.offset_msg_id) == events  # the offset id finds the same
    env = {**os.environ, "ORBIT_NAMESRV": namesrv_addr}
    out = orbit(env, "message", "trace", r.msg_id, "--topic", TOPIC)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[2] for line in lines] == ["stored", "delivered", "consumed"]
    assert "group=tg" in lines[1]
    assert "producerGroup=tp" in lines[0]
    out = orbit(env, "message", "trace", r.msg_id, "--topic", TOPIC, "--json")
    assert [json.loads(line)["event"] for line in out.stdout.splitlines()] == ["stored", "delivered", "consumed"]
    missing = orbit(env, "message", "trace", "0" * 32, "--topic", TOPIC)
    assert missing.returncode == 1
    assert "no trace of message" in missing.stderr


@pytest.mark.asyncio
async def test_a_failed_consumption_shows_as_retried_then_dead_lettered(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    # One-second retry ladder; the group gives up after 1 retry: delivered, retried, redelivered
    # from the retry topic, dead-lettered.
    start_broker(namesrv.address, *TRACE_ON, "--set", "message_delay_level=" + " ".join(["1s"] * 18))
    namesrv_addr = namesrv.address
    [r] = await send(namesrv_addr, 1, "bad", "p2")
    c = PushConsumer("tg-fail", namesrv_addrs=namesrv_addr, instance_name="c3", max_reconsume_times=1, **QUICK)
    c.subscribe(TOPIC)

    @c.on_message
    def fail(msgs: list[MessageExt]) -> ConsumeResult:
        return ConsumeResult.RECONSUME_LATER

    await c.start()
    try:
        events: list[dict[str, Any]] = []

        async def dead() -> bool:
            nonlocal events
            events = await trace(namesrv_addr, r.msg_id)
            return "dead_lettered" in kinds(events)

        await until(dead, "a dead_lettered event")
    finally:
        await c.shutdown()
    retried = [e for e in events if e["event"] == "retried"]
    dead_lettered = [e for e in events if e["event"] == "dead_lettered"]
    assert len(retried) == 1, events
    assert retried[0]["group"] == "tg-fail"
    assert retried[0]["retryTopic"] == "%RETRY%tg-fail"
    assert retried[0]["topic"] == TOPIC
    assert dead_lettered[0]["dlqTopic"] == "%DLQ%tg-fail"
    assert kinds(events).index("retried") < kinds(events).index("dead_lettered")
    assert "consumed" not in kinds(events), "a message given back is not reported consumed by that group"


@pytest.mark.asyncio
async def test_trace_off_still_answers_stored_from_the_record(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    start_broker(namesrv.address, "--set", "trace_enabled=false")
    [r] = await send(namesrv.address, 1, "off", "p")
    events = await trace(namesrv.address, r.msg_id)
    assert kinds(events) == ["stored"]
    assert events[0]["source"] == "record"


@pytest.mark.asyncio
async def test_kill_9_keeps_flushed_events_and_every_stored_message(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "trace-store"
    broker = start_broker(namesrv.address, *TRACE_ON, store_dir=store)
    first = await send(namesrv.address, 30, "a", "p1")
    got: list[str] = []
    c = consumer(namesrv.address, "c1", got)
    await c.start()
    try:

        async def last_consumed() -> bool:
            return "consumed" in kinds(await trace(namesrv.address, first[-1].msg_id))

        await until(last_consumed, "the last message's consumed event")  # the query flushed the buffer
    finally:
        await c.shutdown()
    await until(lambda: no_held_pulls(namesrv.address, broker), "the broker letting go of the consumer's held pull")
    later = await send(namesrv.address, 20, "b", "p2")  # their stored events may still be buffered
    broker.kill()
    start_broker(namesrv.address, *TRACE_ON, store_dir=store)
    for r in first:
        events = await trace(namesrv.address, r.msg_id)
        assert kinds(events) == ["stored", "delivered", "consumed"], (r.msg_id, events)
    for r in later:
        events = await trace(namesrv.address, r.offset_msg_id)
        assert kinds(events) == ["stored"], events  # from the trace topic, or rebuilt from the record
        assert events[0]["uniqKey"] == r.msg_id
