"""The official RocketMQ 5 Node.js client (``rocketmq-client-nodejs`` from npm, unmodified)
against a real broker process's gRPC endpoint: producing with tags, keys and message groups, a
SimpleConsumer receiving and acknowledging, a delayed message recalled before its time while
another arrives at its own, and transactions committed, rolled back and checked back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import ServerProcess
from tests.integration.rocketmq5_endpoint import GRPC, Endpoint, names

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture
def endpoint(start_broker: Callable[..., ServerProcess], tmp_path: Path) -> Endpoint:
    return Endpoint(start_broker(None, *GRPC), tmp_path / "client-home")


async def test_node_client_produces_and_consumes(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic)
    await endpoint.group(group)
    specs = [{"body": f"n{i}", "tag": "a", "keys": [f"k{i}"], "group": "g1" if i % 2 else None} for i in range(6)]
    sent = endpoint.run_node("produce", topic=topic, messages=specs)["sent"]
    assert len({s["messageId"] for s in sent}) == 6
    got = endpoint.run_node("simple", topic=topic, group=group, tag="a", count=6, timeoutMs=20000)["received"]
    assert sorted(m["body"] for m in got) == [f"n{i}" for i in range(6)]
    for m in got:
        i = int(m["body"][1:])
        assert (m["tag"], m["keys"], m["attempt"]) == ("a", [f"k{i}"], 1)
        assert m["group"] == ("g1" if i % 2 else None)
    again = endpoint.run_node("simple", topic=topic, group=group, count=1, timeoutMs=3000)["received"]
    assert again == []  # acknowledged


async def test_node_push_consumer_retries_and_change_invisible_duration(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic)
    await endpoint.group(group)
    await endpoint.group(group + "-simple")
    endpoint.run_node("produce", topic=topic, messages=[{"body": f"p{i}"} for i in range(6)])
    got = endpoint.run_node("push", topic=topic, group=group, count=6, failFirst=1, timeoutMs=30000)["consumed"]
    attempts: dict[str, list[int]] = {}
    for m in got:
        attempts.setdefault(m["body"], []).append(m["attempt"])
    assert sorted(attempts) == [f"p{i}" for i in range(6)]
    assert all(a[:2] == [1, 2] for a in attempts.values()), attempts
    # changeInvisibleDuration: a message held for a minute is handed out again after one second.
    first = endpoint.run_node(
        "simple", topic=topic, group=group + "-simple", count=1, invisibleMs=60000, ack=False, changeInvisibleMs=1000
    )["received"]
    assert len(first) == 1
    again = endpoint.run_node("simple", topic=topic, group=group + "-simple", count=6, timeoutMs=15000)["received"]
    assert first[0]["body"] in [m["body"] for m in again]
    assert next(m["attempt"] for m in again if m["body"] == first[0]["body"]) == 2


async def test_node_client_recalls_a_delayed_message_before_its_time(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group)
    start = time.time()
    sent = endpoint.run_node(
        "produce", topic=topic, messages=[{"body": "recalled", "delayMs": 4000}, {"body": "kept", "delayMs": 4000}]
    )["sent"]
    assert all(s["recallHandle"] for s in sent)
    recalled = endpoint.run_node("recall", topic=topic, handle=sent[0]["recallHandle"])
    assert recalled["messageId"] == sent[0]["messageId"]
    got = endpoint.run_node("simple", topic=topic, group=group, count=1, timeoutMs=12000)["received"]
    assert [m["body"] for m in got] == ["kept"]
    assert got[0]["at"] >= start + 4 - 0.2
    # The recalled one was due at the same time: it is not delivered.
    assert endpoint.run_node("simple", topic=topic, group=group, count=1, timeoutMs=2000)["received"] == []
    # A handle of another topic, or no handle at all, is refused.
    other = endpoint.run_node("error", topic=topic, call="recall", handle="bm90LWEtaGFuZGxl")
    assert other["error"] is not None


async def test_node_client_transactions(endpoint: Endpoint) -> None:
    topic, group = names()
    await endpoint.topic(topic, queues=1)
    await endpoint.group(group)
    specs = [{"body": "committed", "resolution": "commit"}, {"body": "rolled-back", "resolution": "rollback"},
             {"body": "checked", "resolution": "none"}]  # fmt: skip
    out = endpoint.run_node("transaction", topic=topic, messages=specs, check="commit", checkWaitMs=20000)
    assert out["checked"] == [out["sent"][2]["messageId"]]
    got = endpoint.run_node("simple", topic=topic, group=group, count=2, timeoutMs=6000)["received"]
    assert sorted(m["body"] for m in got) == ["checked", "committed"]
