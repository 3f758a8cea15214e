"""Consumption retries and dead-letter queues against real name server and broker processes:
CONSUMER_SEND_MSG_BACK (36) to ``%RETRY%<group>`` with the delay ladder, ``%DLQ%<group>`` after
the max reconsume times, orderly retries in place, ``orbit dlq``, the stock C++ client's
"consume later", and a broker killed with SIGKILL while messages wait in retry.

Every broker here runs the ladder at 1 s a level (``message_delay_level``), so a retry comes a
second after the failure instead of 10 s, 30 s, ..."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
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
from sdk import ConsumeResult, Message, MessageExt, Producer, PushConsumer
from sdk.admin import AdminClient
from tests.integration.helpers import QUICK, create_topic, orbit, until

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration

FAST_LADDER = ["--set", "message_delay_level=" + " ".join(["1s"] * 18)]
# Consumers that notice a restarted broker (new port) within a second.
FAST: dict[str, Any] = {
    **QUICK,
    "route_refresh_interval_ms": 300,
    "pull_retry_delay_ms": 200,
    "pull_suspend_ms": 2000,
    "reconsume_delay_ms": 200,
    "request_timeout_ms": 2000,
}


@pytest.fixture
def ns(namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]) -> str:
    start_broker(namesrv.address, *FAST_LADDER)
    return namesrv.address


def consumer(ns: str, group: str, topic: str, name: str = "c1", **options: Any) -> PushConsumer:
    c = PushConsumer(group, namesrv_addrs=ns, instance_name=name, **{**FAST, **options})
    c.subscribe(topic)
    return c


@pytest.mark.asyncio
async def test_a_failed_message_comes_back_from_the_retry_topic_then_lands_in_the_dlq(ns: str) -> None:
    await create_topic(ns, "Orders", 2)
    seen: list[tuple[bytes, int, str, str, float]] = []  # body, reconsume times, topic, msg id, when

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            seen.append((m.body, m.reconsume_times, m.topic, m.msg_id, time.monotonic()))
        m = msgs[0]
        if m.body == b"poison" or (m.body == b"flaky" and m.reconsume_times == 0):
            return ConsumeResult.RECONSUME_LATER
        if m.body == b"raises" and m.reconsume_times == 0:
            raise RuntimeError("an exception counts as consume later")
        return ConsumeResult.SUCCESS

    c = consumer(ns, "g1", "Orders", max_reconsume_times=2)
    c.on_message(listener)
    await c.start()
    try:
        assert c.retry_topic in c.subscriptions, "a clustering member consumes its group's retry topic"
        async with Producer("p", namesrv_addrs=ns) as producer:
            sent = {b: await producer.send(Message("Orders", b, tags="T", keys=b.decode())) for b in
                    (b"ok", b"flaky", b"raises", b"poison")}  # fmt: skip
        await until(lambda: sum(1 for s in seen if s[0] == b"poison") == 3, "poison's three deliveries", 30)
        async with AdminClient([ns]) as admin:
            await until(lambda: admin.dlq_messages("g1"), "poison in the DLQ")
            (dead,) = await admin.dlq_messages("g1")
    finally:
        await c.shutdown()
    by_body: dict[bytes, list[tuple[bytes, int, str, str, float]]] = {}
    for s in seen:
        by_body.setdefault(s[0], []).append(s)
    assert [s[1] for s in by_body[b"ok"]] == [0]
    assert [s[1] for s in by_body[b"flaky"]] == [0, 1]
    assert [s[1] for s in by_body[b"raises"]] == [0, 1]
    assert [s[1] for s in by_body[b"poison"]] == [0, 1, 2]
    for body, deliveries in by_body.items():
        # Listeners see the topic they subscribed to and the producer's id, however often retried.
        assert {(s[2], s[3]) for s in deliveries} == {("Orders", sent[body].msg_id)}
        for a, b in itertools.pairwise(deliveries):
            assert b[4] - a[4] >= 0.8, f"{body!r}: retried after {b[4] - a[4]:.2f} s, not after the 1 s level"
    assert dead.body == b"poison"
    assert dead.topic == "%DLQ%g1"
    assert dead.reconsume_times == 3
    assert dead.tags == "T"
    assert dead.keys == ["poison"]
    assert dead.properties["RETRY_TOPIC"] == "Orders"
    assert dead.properties["UNIQ_KEY"] == sent[b"poison"].msg_id
    assert dead.properties["ORIGIN_MESSAGE_ID"] == sent[b"poison"].offset_msg_id
    assert "DELAY" not in dead.properties


async def _invoke(addr: str, code: int, **ext: str) -> RemotingCommand:
    client = RemotingClient()
    try:
        return await client.invoke(addr, RemotingCommand(code, ext_fields=ext), 3000)
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_the_broker_follows_the_groups_retry_max_times_and_the_clients_dlq_request(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    broker = start_broker(namesrv.address, *FAST_LADDER)
    ns = namesrv.address
    await create_topic(ns, "Raw", 1)
    async with Producer("p", namesrv_addrs=ns) as producer:
        results = [await producer.send(Message("Raw", b"m%d" % i)) for i in range(3)]
    offsets = [int(r.offset_msg_id[16:], 16) for r in results]
    group = {"groupName": "raw", "retryMaxTimes": 1}
    client = RemotingClient()
    try:
        cmd = RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(group).encode())
        assert (await client.invoke(broker.address, cmd, 3000)).code == ResponseCode.SUCCESS
    finally:
        await client.close()

    # No maxReconsumeTimes header (as old clients send): the group's retryMaxTimes (1) counts.
    r = await _invoke(broker.address, RequestCode.CONSUMER_SEND_MSG_BACK, offset=str(offsets[0]), group="raw",
                      delayLevel="0")  # fmt: skip
    assert r.code == ResponseCode.SUCCESS, r.remark
    # delayLevel -1: straight to the DLQ whatever the count.
    r = await _invoke(broker.address, RequestCode.CONSUMER_SEND_MSG_BACK, offset=str(offsets[1]), group="raw",
                      delayLevel="-1", maxReconsumeTimes="16")  # fmt: skip
    assert r.code == ResponseCode.SUCCESS, r.remark
    # An offset that is no message's.
    r = await _invoke(broker.address, RequestCode.CONSUMER_SEND_MSG_BACK, offset=str(offsets[2] + 1), group="raw")
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "look message by offset failed" in (r.remark or "")

    async with AdminClient([ns]) as admin:
        await until(lambda: admin.dlq_messages("raw"), "m1 in the DLQ")
        assert [m.body for m in await admin.dlq_messages("raw")] == [b"m1"]
        # m0 waits on the retry topic (after the 1 s level); send its copy back once more: out of retries.
        await until(lambda: _queue_has(admin, "%RETRY%raw"), "m0 on the retry topic")
        (retried,) = await admin.query_by_key("%RETRY%raw", results[0].msg_id)
        assert retried.reconsume_times == 1
        assert retried.properties["RETRY_TOPIC"] == "Raw"
        r = await _invoke(broker.address, RequestCode.CONSUMER_SEND_MSG_BACK,
                          offset=str(retried.commit_log_offset), group="raw")  # fmt: skip
        assert r.code == ResponseCode.SUCCESS, r.remark
        await until(lambda: _count(admin, "raw", 2), "m0 in the DLQ too")
        dead = {m.body: m for m in await admin.dlq_messages("raw")}
    assert dead[b"m0"].reconsume_times == 2
    assert dead[b"m0"].properties["ORIGIN_MESSAGE_ID"] == results[0].offset_msg_id
    assert dead[b"m1"].reconsume_times == 1


async def _queue_has(admin: AdminClient, topic: str) -> bool:
    try:
        return any(q.max_offset > 0 for q in await admin.describe_topic(topic))
    except Exception:
        return False


async def _count(admin: AdminClient, group: str, n: int) -> bool:
    return len(await admin.dlq_messages(group)) == n


@pytest.mark.asyncio
async def test_orderly_consumption_retries_in_place_keeps_order_and_parks_a_poison_message(ns: str) -> None:
    await create_topic(ns, "Seq", 1)
    calls: list[tuple[bytes, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        (m,) = msgs
        calls.append((m.body, m.reconsume_times))
        if (m.body == b"3" and m.reconsume_times < 2) or m.body == b"poison":
            return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeResult.SUCCESS

    c = consumer(ns, "og", "Seq", suspend_current_queue_ms=200, max_reconsume_times=2)
    c.on_message_orderly(listener)
    async with Producer("p", namesrv_addrs=ns) as producer:
        for body in [b"0", b"1", b"2", b"3", b"4", b"poison", b"6", b"7"]:
            await producer.send(Message("Seq", body))
    await c.start()
    try:
        await until(lambda: (b"7", 0) in calls, "the last message", 30)
        async with AdminClient([ns]) as admin:
            dead = await admin.dlq_messages("og")
    finally:
        await c.shutdown()
    assert calls == [
        (b"0", 0), (b"1", 0), (b"2", 0), (b"3", 0), (b"3", 1), (b"3", 2), (b"4", 0),
        (b"poison", 0), (b"poison", 1), (b"poison", 2), (b"6", 0), (b"7", 0),
    ]  # fmt: skip
    assert [m.body for m in dead] == [b"poison"]
    assert dead[0].properties["RETRY_TOPIC"] == "Seq"


@pytest.mark.asyncio
async def test_orbit_dlq_lists_gets_and_resends_a_dead_letter(ns: str) -> None:
    await create_topic(ns, "Bills", 1)
    fixed = asyncio.Event()
    got: list[tuple[bytes, int, str]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        m = msgs[0]
        got.append((m.body, m.reconsume_times, m.topic))
        return ConsumeResult.SUCCESS if fixed.is_set() else ConsumeResult.RECONSUME_LATER

    c = consumer(ns, "bg", "Bills", max_reconsume_times=0)  # the first failure parks it
    c.on_message(listener)
    await c.start()
    env = dict(os.environ, ORBIT_NAMESRV=ns)
    try:
        async with Producer("p", namesrv_addrs=ns) as producer:
            sent = await producer.send(Message("Bills", b"invoice-7", tags="inv", keys="k7"))
        async with AdminClient([ns]) as admin:
            await until(lambda: admin.dlq_messages("bg"), "the message in the DLQ")

        listed = await asyncio.to_thread(orbit, env, "dlq", "list", "bg", "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert row["msg_id"] == sent.msg_id
        assert row["original_topic"] == "Bills"
        assert row["origin_message_id"] == sent.offset_msg_id
        assert row["body"] == "invoice-7"
        assert row["reconsume_times"] == 1
        text = await asyncio.to_thread(orbit, env, "dlq", "list", "bg")
        assert sent.msg_id in text.stdout
        assert "topic=Bills" in text.stdout

        for name in (sent.msg_id, row["dlq_msg_id"], sent.offset_msg_id):  # any of its ids names it
            one = await asyncio.to_thread(orbit, env, "dlq", "get", "bg", name)
            assert one.returncode == 0, one.stderr
            assert json.loads(one.stdout)["dlq_msg_id"] == row["dlq_msg_id"]
        missing = await asyncio.to_thread(orbit, env, "dlq", "get", "bg", "0" * 32)
        assert missing.returncode == 1
        assert "no message" in missing.stderr

        fixed.set()
        before = len(got)
        resent = await asyncio.to_thread(orbit, env, "dlq", "resend", "bg", sent.msg_id, "--json")
        assert resent.returncode == 0, resent.stderr
        assert json.loads(resent.stdout)["topic"] == "Bills"
        await until(lambda: len(got) > before, "the re-sent message")
        assert got[before] == (b"invoice-7", 0, "Bills")  # reconsume times back at 0
        bad = await asyncio.to_thread(orbit, env, "dlq", "resend", "bg")
        assert bad.returncode == 2
        assert "--all" in bad.stderr
        # --all --to-retry: only this group's retry topic gets it.
        again = await asyncio.to_thread(orbit, env, "dlq", "resend", "bg", "--all", "--to-retry", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["topic"] == "%RETRY%bg"
        await until(lambda: len(got) > before + 1, "the message from the retry topic")
        assert got[before + 1] == (b"invoice-7", 0, "Bills")
    finally:
        await c.shutdown()


@pytest.mark.skipif(
    not (sys.platform == "linux" and platform.machine() == "x86_64"),
    reason="the third-party client bundles a linux x86_64 librocketmq.so",
)
@pytest.mark.asyncio
async def test_a_stock_clients_consume_later_comes_back_through_the_retry_topic(ns: str, tmp_path: Path) -> None:
    from tests.integration.test_thirdparty_client import Client

    await create_topic(ns, "Stock", 2)
    # The group's retry topic exists before the client starts (as a provisioned group's does): a
    # brand-new group's is made by its first heartbeat, after the C++ client looked its route up,
    # and it looks again only every 30 s (the same with Apache RocketMQ's broker).
    await create_topic(ns, "%RETRY%stock-g", 1)
    async with Producer("p", namesrv_addrs=ns) as producer:
        sent = {b"s%d" % i: await producer.send(Message("Stock", b"s%d" % i)) for i in range(3)}
    client = Client("rocketmq-python-cvs", ns, tmp_path / "cvs", None)
    out = await asyncio.to_thread(
        client.run, "push", "Stock", "stock-g", "--reconsume-later", "1", "--expect", "3", "--idle-s", "1.0",
        "--prop", "RETRY_TOPIC", "--prop", "ORIGIN_MESSAGE_ID", "--timeout-s", "40",
    )  # fmt: skip
    assert not out["timed_out"], out["messages"]
    deliveries: dict[bytes, list[dict[str, Any]]] = {}
    for m in out["messages"]:
        deliveries.setdefault(base64.b64decode(m["body_b64"]), []).append(m)
    assert sorted(deliveries) == sorted(sent)
    assert any(m["reconsume_times"] == 0 for m in out["messages"])
    for body, ms in deliveries.items():
        # The first delivery (rc 0) is answered "consume later"; a message behind it in the
        # same batch goes back unseen (the C API's batch rule). Each comes back exactly once.
        assert [m["reconsume_times"] for m in ms] in ([0, 1], [1]), (body, ms)
        again = ms[-1]
        assert again["topic"] == "Stock", "the C++ client restores the original topic from RETRY_TOPIC"
        assert again["props"]["RETRY_TOPIC"] == "Stock"
        assert again["props"]["ORIGIN_MESSAGE_ID"] == sent[body].offset_msg_id


@pytest.mark.asyncio
async def test_nothing_is_lost_when_the_broker_is_killed_with_messages_in_retry(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]
) -> None:
    seed = int(os.environ.get("ORBIT_TEST_SEED") or random.randrange(2**32))
    print(f"seed {seed} (ORBIT_TEST_SEED={seed} replays it)")
    rnd = random.Random(seed)
    ns = namesrv.address
    broker = start_broker(ns, *FAST_LADDER, name="crash")
    await create_topic(ns, "Crash", 4)
    n = 60
    # Each message fails its first 0-2 deliveries; every seventh always fails (max 3: the DLQ).
    failures = {b"c%02d" % i: (10**6 if i % 7 == 3 else rnd.randrange(3)) for i in range(n)}
    poison = {b for b, f in failures.items() if f > 3}
    good = set(failures) - poison
    consumed: Counter[bytes] = Counter()
    attempts: Counter[bytes] = Counter()
    redelivered = [0]  # deliveries that came through the retry topic
    # The broker dies inside a random listener call (SIGKILL): whatever is in flight then —
    # send-backs, copies waiting out their delay, pulls, offset commits — is cut.
    calls_without_crash = sum(f + 1 for f in failures.values() if f <= 3) + 4 * len(poison)
    kill_at = rnd.randrange(1, calls_without_crash)
    killed: list[str] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        m = msgs[0]
        attempts[m.body] += 1
        if "RETRY_TOPIC" in m.properties:
            redelivered[0] += 1
        if not killed and attempts.total() >= kill_at and c.sent_back_count > redelivered[0]:
            broker.kill()  # at or after a random call, while sent-back copies wait to come back
            killed.append(
                f"killed the broker in listener call {kill_at} of ~{calls_without_crash}: {c.sent_back_count} "
                f"send-backs, {redelivered[0]} redeliveries, {len(consumed)} of {len(good)} consumed"
            )
        if m.reconsume_times < failures[m.body]:
            return ConsumeResult.RECONSUME_LATER
        consumed[m.body] += 1
        return ConsumeResult.SUCCESS

    async with Producer("p", namesrv_addrs=ns, instance_name="crash-p") as producer:
        for body in failures:
            await producer.send(Message("Crash", body))
    c = consumer(ns, "crash-g", "Crash", max_reconsume_times=3)
    c.on_message(listener)
    await c.start()
    admin = AdminClient([ns])
    try:
        await until(lambda: bool(killed), f"the kill at listener call {kill_at}", 30)
        print(killed[0])
        start_broker(ns, *FAST_LADDER, name="crash")  # the same store directory, a new port

        async def dead_letters() -> Counter[bytes]:
            try:
                return Counter(m.body for m in await admin.dlq_messages("crash-g", max_num=10_000))
            except Exception:
                return Counter()

        await until(lambda: set(consumed) == good, "every good message consumed", 45)
        dlq: Counter[bytes] = Counter()

        async def all_parked() -> bool:
            nonlocal dlq
            dlq = await dead_letters()
            return set(dlq) == poison

        await until(all_parked, "every poison message in the DLQ", 45)
    finally:
        await c.shutdown()
        await admin.close()
    duplicates = sum(v - 1 for v in consumed.values()) + sum(v - 1 for v in dlq.values())
    print(
        f"seed {seed}: {len(good)} consumed ({sum(consumed.values())} successful calls), {len(poison)} parked "
        f"({sum(dlq.values())} copies), {duplicates} duplicates, {sum(attempts.values())} listener calls"
    )
    assert set(consumed) == good, f"lost: {sorted(good - set(consumed))}"
    assert set(dlq) == poison, f"lost in retry: {sorted(poison - set(dlq))}"
    assert not set(consumed) & poison
    assert not set(dlq) & good
