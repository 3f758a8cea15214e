"""ClientInstance (sdk/client_instance.py) over a scripted transport, no sockets: the credentials
hook, name server failover, route caching and the TBW102 fallback, heartbeat contents and the
broker's NOTIFY_CONSUMER_IDS_CHANGED."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
import pytest

from data_plane.remoting import bodies
from data_plane.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingConnectError
from sdk import errors
from sdk.client_instance import ClientInstance
from sdk.consumer import ConsumerBase
from sdk.message import MessageQueue

ROUTE = {
    "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6, "topicSynFlag": 0}],
    "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": "10.0.0.1:10911"}}],
}
DEFAULT_ROUTE = {
    "queueDatas": [{"brokerName": "broker-b", "readQueueNums": 8, "writeQueueNums": 8, "perm": 7, "topicSynFlag": 0}],
    "brokerDatas": [{"cluster": "c", "brokerName": "broker-b", "brokerAddrs": {"0": "10.0.0.2:10911"}}],
}


def _answer(code: int, body: Any = None) -> RemotingCommand:
    return RemotingCommand(code, flag=FLAG_RESPONSE, body=orjson.dumps(body) if body is not None else None)


class FakeRemoting:
    """Stands in for RemotingClient: ``script(addr, cmd)`` answers; requests are recorded."""

    def __init__(self, script: Callable[[str, RemotingCommand], RemotingCommand]) -> None:
        self.script = script
        self.requests: list[tuple[str, RemotingCommand]] = []

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000) -> RemotingCommand:
        self.requests.append((addr, cmd))
        return self.script(addr, cmd)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.requests.append((addr, cmd))

    async def close(self) -> None:
        return None


def _routes(known: dict[str, Any]) -> Callable[[str, RemotingCommand], RemotingCommand]:
    def script(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            topic = (cmd.ext_fields or {})["topic"]
            if topic in known:
                return _answer(ResponseCode.SUCCESS, known[topic])
            return _answer(ResponseCode.TOPIC_NOT_EXIST)
        return _answer(ResponseCode.SUCCESS)

    return script


def _instance(
    script: Callable[[str, RemotingCommand], RemotingCommand], **kw: Any
) -> tuple[ClientInstance, FakeRemoting]:
    inst = ClientInstance(kw.pop("namesrv_addrs", "10.9.9.9:9876"), **kw)
    fake = FakeRemoting(script)
    inst.remoting = fake  # type: ignore[assignment]
    return inst, fake


@pytest.mark.asyncio
async def test_the_credentials_hook_adds_its_fields_to_every_request() -> None:
    seen: list[int] = []

    def credentials(cmd: RemotingCommand) -> dict[str, str]:
        seen.append(cmd.code)
        return {"AccessKey": "ak", "Signature": f"sig-{cmd.code}"}

    inst, fake = _instance(_routes({"T": ROUTE}), credentials=credentials)
    await inst.route("T")
    await inst.invoke_oneway(
        "10.0.0.1:10911", RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={"a": "1"})
    )
    assert seen == [RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.UPDATE_CONSUMER_OFFSET]
    route_ext = fake.requests[0][1].ext_fields or {}
    assert route_ext == {"topic": "T", "AccessKey": "ak", "Signature": f"sig-{RequestCode.GET_ROUTEINFO_BY_TOPIC}"}
    assert (fake.requests[1][1].ext_fields or {})["a"] == "1", "the request's own fields stay"


@pytest.mark.asyncio
async def test_a_dead_name_server_is_skipped_and_the_good_one_kept() -> None:
    def script(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        if addr == "10.0.0.8:9876":
            raise RemotingConnectError(addr, "refused")
        return _routes({"T": ROUTE})(addr, cmd)

    inst, fake = _instance(script, namesrv_addrs="10.0.0.8:9876;10.0.0.9:9876")
    await inst.route("T")
    await inst.route("T", refresh=True)
    assert [a for a, _ in fake.requests] == ["10.0.0.8:9876", "10.0.0.9:9876", "10.0.0.9:9876"]


@pytest.mark.asyncio
async def test_routes_are_cached_until_a_refresh_and_an_unknown_topic_is_an_error() -> None:
    inst, fake = _instance(_routes({"T": ROUTE}))
    route = await inst.route("T")
    assert await inst.route("T") is route
    assert len(fake.requests) == 1
    assert inst.find_broker_addr("broker-a") == "10.0.0.1:10911"
    assert await inst.broker_addr(MessageQueue("T", "broker-a", 0)) == "10.0.0.1:10911"
    with pytest.raises(errors.RouteNotFoundError, match="'U'"):
        await inst.route("U")
    with pytest.raises(errors.BrokerNotFoundError):
        await inst.broker_addr(MessageQueue("T", "broker-x", 0))


@pytest.mark.asyncio
async def test_an_unknown_topic_is_sent_through_the_default_topics_brokers_with_four_queues() -> None:
    inst, _ = _instance(_routes({"TBW102": DEFAULT_ROUTE}))
    route = await inst.publish_route("NewTopic")
    assert route.publish_queues == tuple(MessageQueue("NewTopic", "broker-b", i) for i in range(4))
    assert inst.find_broker_addr("broker-b") == "10.0.0.2:10911"
    bare, _ = _instance(_routes({}))
    with pytest.raises(errors.RouteNotFoundError, match="auto-creates"):
        await bare.publish_route("NewTopic")


@pytest.mark.asyncio
async def test_heartbeats_carry_every_group_and_go_to_every_broker() -> None:
    inst, fake = _instance(_routes({"T": ROUTE, "U": DEFAULT_ROUTE}))
    consumer = ConsumerBase("cg", namesrv_addrs="h:1", consume_from="FIRST_OFFSET", message_model="BROADCASTING")
    consumer.subscribe("T", "a || b")

    class P:
        group = "pg"

        def topics(self) -> Iterable[str]:
            return ["U"]

    inst.add_producer(P())
    inst.add_consumer(consumer)
    with pytest.raises(errors.ClientStateError, match="instance_name"):
        inst.add_consumer(consumer)
    await inst.route("T")
    await inst.route("U")
    assert await inst.send_heartbeat_to_all_brokers() == 2
    beats = [(a, c) for a, c in fake.requests if c.code == RequestCode.HEART_BEAT]
    assert sorted(a for a, _ in beats) == ["10.0.0.1:10911", "10.0.0.2:10911"]
    data = bodies.loads_object(beats[0][1].body_bytes())
    assert data["clientID"] == inst.client_id
    assert data["producerDataSet"] == [{"groupName": "pg"}]
    (cd,) = data["consumerDataSet"]
    assert {k: cd[k] for k in ("groupName", "consumeType", "messageModel", "consumeFromWhere", "unitMode")} == {
        "groupName": "cg",
        "consumeType": "CONSUME_PASSIVELY",
        "messageModel": "BROADCASTING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
        "unitMode": False,
    }
    (sd,) = cd["subscriptionDataSet"]
    assert (sd["topic"], sd["subString"], sd["tagsSet"], sd["expressionType"]) == ("T", "a || b", ["a", "b"], "TAG")


def test_notify_consumer_ids_changed_wakes_that_groups_rebalance_only() -> None:
    inst = ClientInstance("10.9.9.9:9876")
    a = ConsumerBase("ga", namesrv_addrs="h:1")
    b = ConsumerBase("gb", namesrv_addrs="h:1")
    inst.add_consumer(a)
    inst.add_consumer(b)

    class Conn:
        peer = "10.0.0.1:10911"

    notice = RemotingCommand(
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, flag=FLAG_ONEWAY, ext_fields={"consumerGroup": "gb"}
    )
    dispatch = inst.remoting.dispatch
    assert dispatch is not None
    assert dispatch(Conn(), notice) is None  # type: ignore[arg-type]  # oneway: no answer
    assert b._rebalance_wakeup.is_set()
    assert not a._rebalance_wakeup.is_set()
    other = dispatch(Conn(), RemotingCommand(RequestCode.PULL_MESSAGE))  # type: ignore[arg-type]  # no client handles it
    assert isinstance(other, RemotingCommand)
    assert other.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


@pytest.mark.asyncio
async def test_consumer_ids_come_from_a_broker_of_the_topic() -> None:
    def script(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
            assert addr == "10.0.0.1:10911"
            assert (cmd.ext_fields or {}) == {"consumerGroup": "g"}
            return _answer(ResponseCode.SUCCESS, {"consumerIdList": ["x@1#a", "y@2#b"]})
        return _routes({"T": ROUTE})(addr, cmd)

    inst, _ = _instance(script)
    assert await inst.consumer_ids("g", "T") == ["x@1#a", "y@2#b"]


def test_name_server_addresses_are_checked() -> None:
    with pytest.raises(errors.IllegalArgumentError, match="empty"):
        ClientInstance("")
    with pytest.raises(errors.IllegalArgumentError, match="host:port"):
        ClientInstance("localhost")
    assert ClientInstance(["a:1", " b:2 "]).namesrv_addrs == ("a:1", "b:2")
