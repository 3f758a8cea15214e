"""The official RocketMQ 5 Python client (``rocketmq-python-client`` from PyPI, unmodified)
against a real broker process's gRPC endpoint: normal, FIFO, delayed and transactional
producers; SimpleConsumer receive / ack / changeInvisibleDuration; PushConsumer; a consumer that
dies holding leases; the last attempt going to the dead-letter topic; leases and
acknowledgements across a kill -9 of the broker. The client runs in processes of its own
(tests/rocketmq5_client.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from tests import rocketmq5_client as v5
from tests.integration.conftest import ServerProcess
from tests.integration.rocketmq5_endpoint import GRPC, Endpoint, names

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture
def endpoint(start_broker: Callable[..., ServerProcess], tmp_path: Path) -> Endpoint:
    v5.client_python()
    return Endpoint(start_broker(None, *GRPC), tmp_path / "client-home")


async def test_produce_then_receive_and_ack_with_tags_keys_and_properties(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic)
    await endpoint.group(group)
    specs = [
        {"body": f"m{i}", "tag": "a" if i % 2 else "b", "keys": f"k{i}", "props": {"n": str(i)}} for i in range(12)
    ]
    sent = endpoint.run("produce", topic=topic, messages=specs)["sent"]
    assert len({s["message_id"] for s in sent}) == 12
    got = endpoint.run("simple", topic=topic, group=group, expression="a", count=6, timeout_s=20)
    assert got["errors"] == []
    received = {m["body"]: m for m in got["received"]}
    assert sorted(received) == sorted(f"m{i}" for i in range(12) if i % 2)
    by_id = {s["message_id"]: i for i, s in enumerate(sent)}
    for m in got["received"]:
        i = by_id[m["message_id"]]
        assert (m["body"], m["tag"], m["keys"], m["props"]) == (f"m{i}", "a", [f"k{i}"], {"n": str(i)})
        assert m["attempt"] == 1
        assert not m["corrupted"]  # the MD5 digest the broker sends matches the body
    # Acknowledged: the group gets nothing again; the filtered-out ones are not the group's.
    again = endpoint.run("simple", topic=topic, group=group, expression="a", count=1, timeout_s=3, await_s=1)
    assert again["received"] == []
    # Another group sees everything, the tag-b messages included (a SQL92 filter this time).
    other = endpoint.run("simple", topic=topic, group=group + "x", sql="n >= 10", count=2, timeout_s=20)
    assert sorted(m["body"] for m in other["received"]) == ["m10", "m11"]


async def test_a_consumer_that_dies_holding_leases_gets_them_redelivered_after_the_lease(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=2)
    await endpoint.group(group)
    endpoint.run("produce", topic=topic, messages=[{"body": f"m{i}"} for i in range(6)])
    first = endpoint.run("simple", topic=topic, group=group, count=6, invisible_s=3, ack=False, crash=True)
    assert len(first["received"]) == 6
    leased_at = min(m["at"] for m in first["received"])
    second = endpoint.run("simple", topic=topic, group=group, count=6, invisible_s=30, timeout_s=30, await_s=5)
    assert sorted(m["body"] for m in second["received"]) == [f"m{i}" for i in range(6)]
    assert all(m["attempt"] == 2 for m in second["received"])
    assert min(m["at"] for m in second["received"]) >= leased_at + 3 - 0.5  # not before the lease ended


async def test_change_invisible_duration_hands_the_message_out_again_sooner(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group)
    endpoint.run("produce", topic=topic, messages=[{"body": "x"}])
    first = endpoint.run("simple", topic=topic, group=group, count=1, invisible_s=60, ack=False, change_invisible_s=1)
    assert len(first["received"]) == 1
    again = endpoint.run("simple", topic=topic, group=group, count=1, invisible_s=60, timeout_s=15)
    assert [(m["body"], m["attempt"]) for m in again["received"]] == [("x", 2)]


async def test_push_consumer_gets_a_failed_message_again_with_its_attempt_counted(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic)
    await endpoint.group(group)
    endpoint.run("produce", topic=topic, messages=[{"body": f"m{i}"} for i in range(8)])
    got = endpoint.run("push", topic=topic, group=group, count=8, fail_first=1, timeout_s=40)["consumed"]
    attempts = defaultdict(list)
    for m in got:
        attempts[m["body"]].append(m["attempt"])
    assert sorted(attempts) == [f"m{i}" for i in range(8)]
    assert all(a[:2] == [1, 2] for a in attempts.values()), attempts


async def test_the_last_attempt_goes_to_the_dead_letter_topic(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group, retryMaxTimes=1)  # two deliveries in all
    endpoint.run("produce", topic=topic, messages=[{"body": "poison"}])
    for attempt in (1, 2):
        got = endpoint.run("simple", topic=topic, group=group, count=1, invisible_s=1, ack=False, timeout_s=15)
        assert [m["attempt"] for m in got["received"]] == [attempt]
    after = endpoint.run("simple", topic=topic, group=group, count=1, invisible_s=1, timeout_s=4, await_s=2)
    assert after["received"] == []
    assert await endpoint.max_offset(f"%DLQ%{group}") == 1


async def test_fifo_group_delivers_a_message_group_in_order_one_at_a_time(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic)
    await endpoint.group(group, consumeMessageOrderly=True)
    specs = [{"body": f"{g}-{i}", "group": g} for i in range(5) for g in ("ga", "gb", "gc")]
    endpoint.run("produce", topic=topic, messages=specs)
    got = endpoint.run("push", topic=topic, group=group, count=15, fail_first=1, timeout_s=60)["consumed"]
    seen: dict[str, list[int]] = defaultdict(list)
    for m in sorted(got, key=lambda m: m["at"]):
        g, i = m["body"].split("-")
        assert m["group"] == g
        seen[g].append(int(i))
    for g, order in seen.items():
        assert order == sorted(order), f"message group {g} out of order: {order}"
        assert sorted(set(order)) == list(range(5))


async def test_a_delayed_message_arrives_at_its_delivery_time(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group)
    due = time.time() + 4
    endpoint.run("produce", topic=topic, messages=[{"body": "later", "delivery_ms": int(due * 1000)}])
    got = endpoint.run("simple", topic=topic, group=group, count=1, timeout_s=20, await_s=5)
    assert [m["body"] for m in got["received"]] == ["later"]
    assert got["received"][0]["at"] >= due - 0.2


async def test_transactions_commit_roll_back_and_are_checked_back(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group)
    specs = [{"body": "committed", "resolution": "commit"}, {"body": "rolled-back", "resolution": "rollback"},
             {"body": "checked", "resolution": "none"}]  # fmt: skip
    out = endpoint.run("transaction", topic=topic, messages=specs, check="commit", check_wait_s=20)
    assert out["checked"] == [out["sent"][2]["message_id"]]  # only the unresolved one is checked
    got = endpoint.run("simple", topic=topic, group=group, count=2, timeout_s=8, await_s=2)
    assert sorted(m["body"] for m in got["received"]) == ["checked", "committed"]  # never the rolled-back one


async def test_leases_and_acknowledgements_survive_a_kill_9_of_the_broker(
    start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    ep = Endpoint(start_broker(None, *GRPC, store_dir=store), tmp_path / "client-home")
    topic, group = names()
    await ep.topic(topic, queues=2)
    await ep.group(group)
    ep.run("produce", topic=topic, messages=[{"body": f"m{i}"} for i in range(10)])
    acked = ep.run("simple", topic=topic, group=group, count=5, invisible_s=30)["received"]
    leased = ep.run("simple", topic=topic, group=group, count=5, invisible_s=4, ack=False, crash=True)["received"]
    assert (len(acked), len(leased)) == (5, 5)
    ep.proc.kill()
    ep = Endpoint(start_broker(None, *GRPC, store_dir=store), tmp_path / "client-home")
    got = ep.run("simple", topic=topic, group=group, count=5, invisible_s=30, timeout_s=20, await_s=5)["received"]
    # The leased five come back once their lease ends; the acknowledged five never do.
    assert sorted(m["body"] for m in got) == sorted(m["body"] for m in leased)
    assert ep.run("simple", topic=topic, group=group, count=1, timeout_s=2, await_s=1)["received"] == []
    assert all(m["attempt"] == 2 for m in got)
    assert min(m["at"] for m in got) >= min(m["at"] for m in leased) + 4 - 0.5


def v4_heartbeat(group: str, topic: str) -> bytes:
    data = {
        "clientID": "v4-consumer@1",
        "producerDataSet": [],
        "consumerDataSet": [
            {
                "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [{"classFilterMode": False, "topic": topic, "subString": "*", "tagsSet": [],
                                         "codeSet": [], "subVersion": 1, "expressionType": "TAG"}],
            }
        ],
    }  # fmt: skip
    return bodies.dumps(data)


async def test_a_group_consumes_by_pull_or_by_lease_not_both(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group)
    await endpoint.group(group + "v5")
    endpoint.run("produce", topic=topic, messages=[{"body": "x"}])
    client = RemotingClient()
    try:
        # A 4.x push consumer of the group is connected: a 5.x receive for the group is refused.
        hb = RemotingCommand(RequestCode.HEART_BEAT, body=v4_heartbeat(group, topic))
        assert (await client.invoke(endpoint.proc.address, hb, 5000)).code == ResponseCode.SUCCESS
        refused = endpoint.run("simple", topic=topic, group=group, count=1, timeout_s=3, await_s=1)
        assert refused["received"] == []
        assert any("by pull (4.x) or by lease (5.x)" in e for e in refused["errors"]), refused
        # A group that consumed by lease: a 4.x consumer's heartbeat for it is refused, saying why.
        got = endpoint.run("simple", topic=topic, group=group + "v5", count=1, timeout_s=10)
        assert [m["body"] for m in got["received"]] == ["x"]
        hb5 = RemotingCommand(RequestCode.HEART_BEAT, body=v4_heartbeat(group + "v5", topic))
        answer = await client.invoke(endpoint.proc.address, hb5, 5000)
        assert answer.code == ResponseCode.NO_PERMISSION
        assert "by pull (4.x) or by lease (5.x)" in (answer.remark or "")
    finally:
        await client.close()


async def test_a_fifo_push_consumer_forwards_a_message_to_the_dlq_after_its_last_attempt(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group, consumeMessageOrderly=True, retryMaxTimes=1)  # two attempts in all
    endpoint.run("produce", topic=topic, messages=[{"body": "poison", "group": "g"}, {"body": "next", "group": "g"}])
    got = endpoint.run("push", topic=topic, group=group, count=1, always_fail=["poison"], timeout_s=20)["consumed"]
    # The FIFO client retries locally, then ForwardMessageToDeadLetterQueue: the group moves on.
    assert [m["body"] for m in got][:2] == ["poison", "poison"], got
    assert "next" in [m["body"] for m in got], got  # its group went on after the first was dead-lettered
    assert await endpoint.max_offset(f"%DLQ%{group}") >= 1
