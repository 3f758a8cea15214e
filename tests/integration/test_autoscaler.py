"""The autoscaler against a real cluster: the control plane on a real PostgreSQL, a multi-tenant
name server and authenticating brokers as processes reporting their load every 0.5 s. A topic
grows when the SDK publishes past what its queues carry, shrinks when the load stops (the queues
read-only until its consumers drained them, then gone, no message left behind), an ordered topic
keeps its queues, a plan's max_queues bounds growth, and a draining broker group hands its queues
to another. The autoscaler's rounds are run by the test; one queue "sustains" 20 msgs/s here."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from control_plane.autoscaler import Autoscaler
from control_plane.load_view import SampledLoad
from control_plane.queue_drain import BrokerDrainCheck
from control_plane.reconcile_source import ServicesStateSource
from control_plane.scaling_policy import ScalingSettings
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2_grpc
from sdk import ConsumeResult, Message, MessageExt, Producer, PushConsumer
from tests.integration.console_support import ConsoleClient
from tests.integration.helpers import QUICK
from tests.integration.tenancy_cluster import (
    TenancyCluster,
    Tenant,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401
from tests.security.test_grpc_endpoint import ack, receive, signed

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
SETTINGS = ScalingSettings(queue_capacity_msgs_per_s=20, grow_at=0.8, target=0.5, shrink_at=0.25, shrink_after_s=1)


def autoscaler(cluster: TenancyCluster) -> Autoscaler:
    source = ServicesStateSource(cluster.services)
    return Autoscaler(
        cluster.services.pool,
        SampledLoad(cluster.services.pool),
        BrokerDrainCheck(cluster.services, source.operator_token),
        SETTINGS,
        window_s=3.0,
        on_change=cluster.reconciler.kick,
    )


async def placements(cluster: TenancyCluster, tenant: Tenant, topic: str) -> dict[str, tuple[int, int]]:
    """{broker group: (writable, every queue)} of the topic."""
    got = await cluster.cp.call("GET", f"/v1/tenants/{tenant.id}/topics/{topic}", token=tenant.token)
    assert got.status == 200, got.body
    return {p["broker_group"]: (p["write_queue_count"], p["queue_count"]) for p in got.body["placements"]}


async def events(cluster: TenancyCluster, tenant: Tenant, topic: str) -> list[dict[str, Any]]:
    got = await cluster.cp.call("GET", f"/v1/tenants/{tenant.id}/topics/{topic}/scaling-events", token=tenant.token)
    assert got.status == 200, got.body
    return list(reversed(got.body["events"]))  # oldest first


async def scaled(
    cluster: TenancyCluster, scaler: Autoscaler, what: str, check: Callable[[], Any], timeout_s: float = 40
) -> None:
    """Run rounds (each after the reconciler applied the last change) until ``check()`` holds."""

    async def done() -> bool:
        await scaler.round()
        return bool(await check())

    await until(done, what, timeout_s=timeout_s)


async def broker_queues(cluster: TenancyCluster, wire_topic: str) -> tuple[int, int]:
    """(writeQueueNums, readQueueNums) broker-a holds for the topic."""
    tc = (await cluster.broker_topics())[wire_topic]
    return int(tc["writeQueueNums"]), int(tc["readQueueNums"])


@asynccontextmanager
async def publishing(cluster: TenancyCluster, tenant: Tenant, topic: str, rate: float) -> AsyncIterator[list[Any]]:
    """The SDK producer sending at about ``rate`` msgs/s until the block ends: the SendResults."""
    results: list[Any] = []
    creds = tenant.credentials(cluster)
    producer = Producer(
        f"{tenant.id}%shop", namesrv_addrs=cluster.namesrv.address, credentials=creds, route_refresh_interval_ms=1000
    )
    await producer.start()
    stop = asyncio.Event()

    async def run() -> None:
        i, start = 0, time.monotonic()
        while not stop.is_set():
            results.append(await producer.send(Message(f"{tenant.id}%{topic}", f"m-{i}".encode())))
            i += 1
            ahead = start + i / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)  # open loop pacing, not a wait for a condition

    task = asyncio.get_running_loop().create_task(run())
    try:
        yield results
    finally:
        stop.set()
        await task
        await producer.shutdown()


@asynccontextmanager
async def consuming(cluster: TenancyCluster, tenant: Tenant, group: str, topic: str) -> AsyncIterator[list[str]]:
    got: list[str] = []

    def ok(msgs: list[MessageExt]) -> ConsumeResult:
        got.extend(m.body.decode() for m in msgs)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        f"{tenant.id}%{group}", namesrv_addrs=cluster.namesrv.address, credentials=tenant.credentials(cluster),
        instance_name=f"scale-{group}", route_refresh_interval_ms=1000, **QUICK,
    )  # fmt: skip
    consumer.subscribe(f"{tenant.id}%{topic}")
    consumer.on_message(ok)
    await consumer.start()
    try:
        yield got
    finally:
        await consumer.shutdown()


async def test_a_topic_grows_with_its_load_then_drains_and_removes_the_queues_it_no_longer_needs(
    tenancy: TenancyCluster,
) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    scaler = autoscaler(tenancy)
    assert await placements(tenancy, acme, "orders") == {"broker-a": (4, 4)}
    async with consuming(tenancy, acme, "billing", "orders") as consumed:
        async with publishing(tenancy, acme, "orders", rate=200) as sent:

            async def grown() -> bool:
                return (await placements(tenancy, acme, "orders"))["broker-a"][0] >= 8

            await scaled(tenancy, scaler, "the topic grown past 8 writable queues", grown)
            writable, every = (await placements(tenancy, acme, "orders"))["broker-a"]
            assert writable == every
            await tenancy.reconciled(rounds=1)
            assert await broker_queues(tenancy, "acme%orders") == (writable, writable)
            # The rate a round sees climbs while its window fills, so the topic may grow in steps:
            # each a grow to more queues, the last to what it has now, the first past 80 % of 4
            # queues at 20 msgs/s.
            grows = await events(tenancy, acme, "orders")
            assert {e["action"] for e in grows} == {"grow"}, grows
            steps = [e["write_queues"] for e in grows]
            assert steps == sorted(set(steps)), steps
            assert steps[0] > 4, steps
            assert steps[-1] == writable, steps
            assert grows[0]["publish_rate"] > 64
            mark = len(sent)

            async def uses_new_queues() -> bool:
                return any(r.message_queue.queue_id >= 4 for r in sent[mark:])

            await until(uses_new_queues, "the producer sending to the queues added", timeout_s=15)
        # The load stops: after a low second the topic shrinks to its minimum, 4 writable queues;
        # the others stay readable until the consumer has drained them, then go.

        async def shrunk() -> bool:
            return (await placements(tenancy, acme, "orders"))["broker-a"][0] == 4

        await scaled(tenancy, scaler, "the topic shrunk to 4 writable queues", shrunk)
        shrink = [e for e in await events(tenancy, acme, "orders") if e["action"] == "shrink"]
        assert [(e["write_queues"], e["read_queues"]) for e in shrink] == [(4, writable)]

        async def removed() -> bool:
            return await placements(tenancy, acme, "orders") == {"broker-a": (4, 4)}

        await scaled(tenancy, scaler, "the drained queues removed", removed)
        await tenancy.reconciled(rounds=1)
        assert await broker_queues(tenancy, "acme%orders") == (4, 4)
        bodies = {r.msg_id for r in sent}
        assert len(bodies) == len(sent)

        async def all_consumed() -> bool:
            return len(set(consumed)) >= len(sent)

        await until(all_consumed, "every message sent consumed", timeout_s=30)
        assert {f"m-{i}" for i in range(len(sent))} == set(consumed), "no message left behind"
    actions = [e["action"] for e in await events(tenancy, acme, "orders")]
    assert actions == ["grow"] * len(steps) + ["shrink", "remove"], actions
    console = ConsoleClient(tenancy.cp.url)  # the tenant's topic page lists them, newest first
    try:
        assert (await console.sign_in(acme.access_key, acme.secret)).status == 303
        page = await console.get("/console/t/acme/topics/orders")
        assert page.status == 200, page.text
        shown = re.findall(r'<tr data-action="(\w+)">', page.text)
        assert shown == ["remove", "shrink"] + ["grow"] * len(steps)
        assert f"<td>4 / {writable}</td>" in page.text  # after the shrink: 4 writable of them all
        assert "drained by every consumer group" in page.text
    finally:
        await console.close()


async def test_an_ordered_topic_keeps_its_queues_and_says_why(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "ledger", message_type="FIFO")
    scaler = autoscaler(tenancy)
    async with publishing(tenancy, acme, "ledger", rate=200):

        async def refused() -> bool:
            return any(e["action"] == "refuse" for e in await events(tenancy, acme, "ledger"))

        await scaled(tenancy, scaler, "the ordered topic's refusal recorded", refused)
    assert await placements(tenancy, acme, "ledger") == {"broker-a": (4, 4)}
    (refusal,) = await events(tenancy, acme, "ledger")
    assert "out of order" in refusal["reason"]


async def test_growth_stops_at_the_plans_max_queues_with_the_reason_recorded(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    quota = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"max_queues": 6})
    assert quota.status == 200, quota.body
    await tenancy.create_topic(acme, "orders")
    scaler = autoscaler(tenancy)
    async with publishing(tenancy, acme, "orders", rate=200):  # asks for 20 writable queues

        async def capped() -> bool:
            kinds = [e["action"] for e in await events(tenancy, acme, "orders")]
            return "refuse" in kinds and "grow" in kinds

        await scaled(tenancy, scaler, "growth within the plan and the rest refused", capped)
    assert await placements(tenancy, acme, "orders") == {"broker-a": (6, 6)}
    got = await events(tenancy, acme, "orders")
    assert [(e["action"], e["write_queues"]) for e in got] == [("grow", 6), ("refuse", 6)]
    assert "the plan allows 6 queues and the tenant has 4" in got[1]["reason"]


async def second_group(cluster: TenancyCluster) -> None:
    """Broker group broker-b: another authenticating broker, in the fleet and reconciled."""
    other = await asyncio.to_thread(
        cluster.spawn_broker, cluster.namesrv.address, *cluster.broker_flags(), name="broker-b"
    )
    made = await cluster.cp.call(
        "POST", "/v1/fleet/broker-groups", operator=True,
        json={"name": "broker-b", "namesrv_addrs": [cluster.namesrv.address], "broker_addrs": [other.address],
              "max_queues": 1000, "max_msgs_per_s": 100_000, "storage_bytes": 1 << 40},
    )  # fmt: skip
    assert made.status == 201, made.body
    await cluster.reconciled(rounds=1)


async def test_new_queues_go_to_a_group_with_headroom_not_to_a_hot_one(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")  # on broker-a, the only group then
    await second_group(tenancy)
    hot = await tenancy.cp.call("PATCH", "/v1/fleet/broker-groups/broker-a", operator=True,
                                json={"max_msgs_per_s": 100})  # fmt: skip
    assert hot.status == 200, hot.body
    scaler = autoscaler(tenancy)
    async with publishing(tenancy, acme, "orders", rate=200):  # broker-a past 80 % of its 100 msgs/s

        async def grown() -> bool:
            return "broker-b" in await placements(tenancy, acme, "orders")

        await scaled(tenancy, scaler, "new queues placed on broker-b", grown)
    got = await placements(tenancy, acme, "orders")
    assert got["broker-a"] == (4, 4), "the hot group took no new queue"
    assert got["broker-b"][0] >= 1  # as many as the rate asked for when it was first seen


async def test_a_topic_on_a_hot_group_keeps_its_queues_while_its_rate_is_low(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    scaler = autoscaler(tenancy)
    async with publishing(tenancy, acme, "orders", rate=200):

        async def grown() -> bool:
            return (await placements(tenancy, acme, "orders"))["broker-a"][0] >= 8

        await scaled(tenancy, scaler, "the topic grown past 8 writable queues", grown)
    writable = (await placements(tenancy, acme, "orders"))["broker-a"][0]
    # broker-a's capacity set below what it stores: the group is hot, and the topic's rate, under
    # the shrink mark now, may be what the group can take rather than what its clients offer.
    hot = await tenancy.cp.call("PATCH", "/v1/fleet/broker-groups/broker-a", operator=True,
                                json={"max_msgs_per_s": 5})  # fmt: skip
    assert hot.status == 200, hot.body
    async with publishing(tenancy, acme, "orders", rate=10):  # under 25 % of what 8 queues carry

        async def held() -> bool:
            return any(
                e["action"] == "refuse" and "broker group broker-a is near its capacity" in e["reason"]
                for e in await events(tenancy, acme, "orders")
            )

        await scaled(tenancy, scaler, "the shrink held, with the reason recorded", held)
        assert (await placements(tenancy, acme, "orders"))["broker-a"] == (writable, writable)
        # No limit on the group: the low rate is low demand, and the topic shrinks.
        cool = await tenancy.cp.call("PATCH", "/v1/fleet/broker-groups/broker-a", operator=True,
                                     json={"max_msgs_per_s": 0})  # fmt: skip
        assert cool.status == 200, cool.body

        async def shrunk() -> bool:
            return (await placements(tenancy, acme, "orders"))["broker-a"][0] < writable

        await scaled(tenancy, scaler, "the topic shrunk once its group was not hot", shrunk)
    actions = [e["action"] for e in await events(tenancy, acme, "orders")]
    assert actions[-2:] == ["refuse", "shrink"], actions


async def test_a_draining_broker_group_hands_its_queues_to_another_and_can_then_go(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    await second_group(tenancy)
    scaler = autoscaler(tenancy)
    async with consuming(tenancy, acme, "billing", "orders") as consumed:
        async with publishing(tenancy, acme, "orders", rate=20) as sent:
            await until(lambda: len(sent) >= 20, "messages on broker-a first")
            drain = await tenancy.cp.call(
                "PATCH", "/v1/fleet/broker-groups/broker-a", operator=True, json={"status": "draining"}
            )
            assert drain.status == 200, drain.body

            async def moved() -> bool:
                return await placements(tenancy, acme, "orders") == {"broker-a": (0, 4), "broker-b": (4, 4)}

            await scaled(tenancy, scaler, "broker-a read-only, broker-b taking the topic", moved)
            mark = len(sent)

            async def on_b() -> bool:
                return len(sent) > mark + 10 and all(r.message_queue.broker_name == "broker-b" for r in sent[-10:])

            await until(on_b, "the producer sending to broker-b only", timeout_s=20)
        in_use = await tenancy.cp.call("DELETE", "/v1/fleet/broker-groups/broker-a", operator=True)
        assert in_use.status == 409, in_use.body

        async def gone_from_a() -> bool:
            return await placements(tenancy, acme, "orders") == {"broker-b": (4, 4)}

        await scaled(tenancy, scaler, "broker-a's drained queues removed", gone_from_a)

        async def all_consumed() -> bool:
            return set(consumed) >= {f"m-{i}" for i in range(len(sent))}

        await until(all_consumed, "every message consumed", timeout_s=30)
    assert [e["action"] for e in await events(tenancy, acme, "orders")] == ["move", "remove"]
    removed = await tenancy.cp.call("DELETE", "/v1/fleet/broker-groups/broker-a", operator=True)
    assert removed.status == 200, removed.body


async def test_a_pop_group_keeps_read_only_queues_until_it_acknowledged_their_messages(tenancy: TenancyCluster) -> None:
    # A RocketMQ 5 simple consumer's group consumes by leases (POP): its acknowledgements move the
    # group's committed offsets, which the drain check reads, so queues a shrink made read-only
    # are not removed while it still has messages on them leased or never received.
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "grpc_listen=127.0.0.1:0")
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "simple")
    async with publishing(tenancy, acme, "orders", rate=200) as sent:
        await until(lambda: len(sent) >= 24, "24 messages sent", timeout_s=15)
    assert {r.message_queue.queue_id for r in sent} == {0, 1, 2, 3}
    check = BrokerDrainCheck(tenancy.services, ServicesStateSource(tenancy.services).operator_token)
    assert not await check.drained("acme", "orders", "broker-a", 0, 4)  # nobody took them
    assert tenancy.broker is not None
    md = signed(acme.access_key, acme.secret, "acme")
    handles: list[str] = []
    async with grpc.aio.insecure_channel(tenancy.broker.info["grpc_address"]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]

        async def received_all() -> bool:
            handles.extend(m.system_properties.receipt_handle for m in await receive(stub, md, "simple"))
            return len(handles) >= len(sent)

        await until(received_all, "every message received under a lease", timeout_s=30)
        assert len(handles) == len(sent)
        assert not await check.drained("acme", "orders", "broker-a", 0, 4)  # leased, not acknowledged
        for h in handles[:-1]:
            assert (await ack(stub, md, "simple", h)).status.code == pb.OK
        assert not await check.drained("acme", "orders", "broker-a", 0, 4)  # one still leased
        assert (await ack(stub, md, "simple", handles[-1])).status.code == pb.OK
    assert await check.drained("acme", "orders", "broker-a", 0, 4)
