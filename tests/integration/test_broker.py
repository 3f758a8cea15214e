"""``orbit broker`` as a real process, spoken to with hand-built RocketMQ requests over
RemotingClient: send (V1, V2, batch), pull (tags, long polling), offsets, lookups by id and key,
heartbeats and consumer-change notices, queue locks, topic administration, bad input, a stalled
client, restarts (SIGTERM and kill -9, with SYNC_FLUSH) and registration with a name server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from data_plane.remoting.command import RemotingCommand, encode_bytes
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import RemotingError
from data_plane.remoting.server import Processors
from data_plane.store.message import StoredMessage, decode_message_id, decode_record, encode_properties

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

    StartBroker = Callable[..., ServerProcess]

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 10.0
GROUP = "cg"
SUB_ALL = PULL_FLAG_SUBSCRIPTION


async def poll(condition: Callable[[], Awaitable[bool]], timeout_s: float = DEADLINE_S) -> bool:
    """True as soon as ``condition()`` holds; False if it still does not at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await condition():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)


async def _eq(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def _same(value: Awaitable[list[str]], expected: list[str]) -> bool:
    return await value == expected


async def _true(value: bool) -> bool:
    return value


def records(resp: RemotingCommand) -> list[StoredMessage]:
    """The records of a PULL / QUERY_MESSAGE body, back to back."""
    raw = resp.body_bytes()
    out = []
    pos = 0
    while pos < len(raw):
        m = decode_record(raw, pos)
        out.append(m)
        pos += m.total_size
    assert pos == len(raw)
    return out


def raw_records(resp: RemotingCommand) -> list[bytes]:
    raw = resp.body_bytes()
    out = []
    pos = 0
    while pos < len(raw):
        (size,) = struct.unpack_from(">i", raw, pos)
        out.append(raw[pos : pos + size])
        pos += size
    return out


def heartbeat_body(client_id: str, group: str = GROUP, topic: str = "T", sub: str = "*") -> bytes:
    return bodies.dumps(
        {
            "clientID": client_id,
            "producerDataSet": [{"groupName": "pg"}],
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [
                        {
                            "classFilterMode": False,
                            "topic": topic,
                            "subString": sub,
                            "tagsSet": [],
                            "codeSet": [],
                            "subVersion": 1,
                            "expressionType": "TAG",
                        }
                    ],
                    "unitMode": False,
                }
            ],
        }
    )


class Wire:
    """One client connection to the broker, building requests by hand."""

    def __init__(self, addr: str, dispatch: Processors | None = None) -> None:
        self.addr = addr
        self.client = RemotingClient(dispatch)

    async def call(
        self, code: int, ext: dict[str, str] | None = None, body: bytes | None = None, timeout_ms: int = 5000
    ) -> RemotingCommand:
        return await self.client.invoke(self.addr, RemotingCommand(code, ext_fields=ext, body=body), timeout_ms)

    async def connection(self) -> Connection:
        return await self.client.connection(self.addr)

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = -1,
        props: dict[str, str] | None = None,
        flag: int = 0,
        born_ts: int | None = None,
        queue_nums: int = 4,
        timeout_ms: int = 5000,
    ) -> RemotingCommand:
        ext = {
            "a": "pg",
            "b": topic,
            "c": "TBW102",
            "d": str(queue_nums),
            "e": str(queue_id),
            "f": "0",
            "g": str(int(time.time() * 1000) if born_ts is None else born_ts),
            "h": str(flag),
            "i": encode_properties(props or {}).decode(),
            "j": "0",
            "k": "false",
        }
        return await self.call(RequestCode.SEND_MESSAGE_V2, ext, body, timeout_ms)

    async def send_ok(self, topic: str, body: bytes, **kw: Any) -> dict[str, str]:
        r = await self.send(topic, body, **kw)
        assert r.code == ResponseCode.SUCCESS, r
        assert r.ext_fields is not None
        return r.ext_fields

    async def send_batch(
        self, topic: str, items: list[tuple[bytes, int, dict[str, str]]], queue_id: int
    ) -> RemotingCommand:
        ext = {
            "a": "pg",
            "b": topic,
            "c": "TBW102",
            "d": "4",
            "e": str(queue_id),
            "f": "0",
            "g": str(int(time.time() * 1000)),
            "h": "0",
            "i": "",
            "j": "0",
            "k": "false",
            "m": "true",
        }
        body = b"".join(bodies.encode_batch_item(b, flag, encode_properties(p)) for b, flag, p in items)
        return await self.call(RequestCode.SEND_BATCH_MESSAGE, ext, body)

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        group: str = GROUP,
        max_nums: int = 32,
        subscription: str | None = "*",
        suspend_ms: int = 0,
        commit_offset: int | None = None,
        timeout_ms: int = 5000,
    ) -> RemotingCommand:
        sys_flag = 0
        if subscription is not None:
            sys_flag |= PULL_FLAG_SUBSCRIPTION
        if suspend_ms:
            sys_flag |= PULL_FLAG_SUSPEND
        if commit_offset is not None:
            sys_flag |= PULL_FLAG_COMMIT_OFFSET
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_nums),
            "sysFlag": str(sys_flag),
            "commitOffset": str(commit_offset if commit_offset is not None else 0),
            "suspendTimeoutMillis": str(suspend_ms),
            "subscription": subscription if subscription is not None else "",
            "subVersion": "0",
        }
        return await self.call(RequestCode.PULL_MESSAGE, ext, None, timeout_ms)

    async def pull_all(self, topic: str, queue_id: int) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        offset = 0
        while True:
            r = await self.pull(topic, queue_id, offset)
            if r.code != ResponseCode.SUCCESS:
                assert r.code == ResponseCode.PULL_NOT_FOUND, r
                return out
            out.extend(records(r))
            assert r.ext_fields is not None
            offset = int(r.ext_fields["nextBeginOffset"])

    async def create_topic(self, topic: str, read: int = 4, write: int | None = None, **more: str) -> RemotingCommand:
        ext = {"topic": topic, "readQueueNums": str(read), "writeQueueNums": str(write or read), "perm": "6"}
        ext.update(more)
        return await self.call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

    async def topic_table(self) -> dict[str, Any]:
        r = await self.call(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert r.code == ResponseCode.SUCCESS
        doc: dict[str, Any] = bodies.loads_object(r.body_bytes())
        return doc

    async def runtime(self) -> dict[str, str]:
        r = await self.call(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert r.code == ResponseCode.SUCCESS
        table: dict[str, str] = bodies.loads_object(r.body_bytes())["table"]
        return table

    async def offset_of(self, code: int, topic: str, queue_id: int, **more: str) -> int:
        r = await self.call(code, {"topic": topic, "queueId": str(queue_id), **more})
        assert r.code == ResponseCode.SUCCESS, r
        assert r.ext_fields is not None
        return int(r.ext_fields["offset"])

    async def consumer_ids(self, group: str = GROUP) -> list[str]:
        r = await self.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        if r.code != ResponseCode.SUCCESS:
            return []
        ids: list[str] = bodies.loads_object(r.body_bytes())["consumerIdList"]
        return ids

    async def heartbeat(self, client_id: str, **kw: str) -> RemotingCommand:
        return await self.call(RequestCode.HEART_BEAT, body=heartbeat_body(client_id, **kw))

    async def lock(self, client_id: str, queues: list[int], *, unlock: bool = False) -> list[int]:
        body = bodies.dumps(
            {
                "consumerGroup": GROUP,
                "clientId": client_id,
                "mqSet": [{"topic": "T", "brokerName": "broker-a", "queueId": q} for q in queues],
            }
        )
        r = await self.call(RequestCode.UNLOCK_BATCH_MQ if unlock else RequestCode.LOCK_BATCH_MQ, body=body)
        assert r.code == ResponseCode.SUCCESS, r
        if unlock:
            return []
        return sorted(mq["queueId"] for mq in bodies.loads_object(r.body_bytes())["lockOKMQSet"])

    async def close(self) -> None:
        await self.client.close()


class Notices:
    """A client's handler of the broker's NOTIFY_CONSUMER_IDS_CHANGED (40)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self.processors = Processors()
        self.processors.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notice)

    def _on_notice(self, conn: Connection, cmd: RemotingCommand) -> None:
        self.queue.put_nowait(cmd)

    async def next(self, timeout_s: float = DEADLINE_S) -> RemotingCommand:
        return await asyncio.wait_for(self.queue.get(), timeout_s)

    def drain(self) -> int:
        n = 0
        while not self.queue.empty():
            self.queue.get_nowait()
            n += 1
        return n


@pytest.fixture
def broker(start_broker: StartBroker) -> ServerProcess:
    """A broker without name servers, small store files, ASYNC_FLUSH."""
    return start_broker(None)


@pytest_asyncio.fixture
async def wires() -> AsyncIterator[Callable[..., Wire]]:
    """``wires(addr)`` → a new client connection (closed after the test)."""
    made: list[Wire] = []

    def make(addr: str, dispatch: Processors | None = None) -> Wire:
        made.append(Wire(addr, dispatch))
        return made[-1]

    yield make
    for w in made:
        await w.close()


@pytest_asyncio.fixture
async def wire(broker: ServerProcess, wires: Callable[..., Wire]) -> Wire:
    return wires(broker.address)


# --- send and pull ----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_send_v2_then_pull_returns_the_exact_message(broker: ServerProcess, wire: Wire) -> None:
    body = bytes(range(256)) * 3 + b"\x00\x01\x02 end"
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "color": "blue", "empty-ish": " "}
    ext = await wire.send_ok("Exact", body, queue_id=1, props=props, flag=7, born_ts=1_700_000_000_123, queue_nums=2)
    assert (ext["queueId"], ext["queueOffset"]) == ("1", "0")
    ip, port, commit_offset = decode_message_id(ext["msgId"])
    assert (ip, port, commit_offset) == ("127.0.0.1", broker.port, 0)

    r = await wire.pull("Exact", 1, 0)
    assert r.code == ResponseCode.SUCCESS, r
    assert r.ext_fields is not None
    assert (r.ext_fields["nextBeginOffset"], r.ext_fields["minOffset"], r.ext_fields["maxOffset"]) == ("1", "0", "1")
    [m] = records(r)
    assert m.body == body
    assert m.topic == "Exact"
    assert m.properties == props
    assert m.tags == "TagA"
    assert m.keys == ["k1", "k2"]
    assert (m.flag, m.born_timestamp, m.queue_id, m.queue_offset, m.commit_log_offset) == (
        7,
        1_700_000_000_123,
        1,
        0,
        0,
    )
    assert m.store_host == ("127.0.0.1", broker.port)
    assert m.born_host[0] == "127.0.0.1"
    assert m.msg_id == ext["msgId"]
    assert abs(m.store_timestamp - time.time() * 1000) < 60_000

    # The topic was created through TBW102 with the queue count the client asked for.
    table = (await wire.topic_table())["topicConfigTable"]
    assert (table["Exact"]["readQueueNums"], table["Exact"]["writeQueueNums"]) == (2, 2)
    ext2 = await wire.send_ok("Exact", b"second", queue_id=1)
    assert ext2["queueOffset"] == "1"
    assert int(decode_message_id(ext2["msgId"])[2]) == m.total_size


@pytest.mark.asyncio
async def test_the_runtime_info_counts_every_stored_message_and_its_bytes(wire: Wire) -> None:
    """putMessageTimesTotal / putMessageSizeTotal (GET_BROKER_RUNTIME_INFO) count single sends
    (the plain path's, with properties or without) and their records' bytes."""
    before = await wire.runtime()
    await wire.create_topic("Counted", 2)
    for i in range(7):
        await wire.send_ok("Counted", b"x" * (100 + i), queue_id=i % 2, props={"TAGS": "t"} if i % 2 else None)
    after = await wire.runtime()
    assert int(after["putMessageTimesTotal"]) - int(before["putMessageTimesTotal"]) == 7
    grew = int(after["putMessageSizeTotal"]) - int(before["putMessageSizeTotal"])
    assert int(after["commitLogMaxOffset"]) - int(before["commitLogMaxOffset"]) == grew, "the records' bytes"


@pytest.mark.asyncio
async def test_an_acknowledged_message_is_in_the_commit_log_file_already(
    start_broker: StartBroker, wires: Callable[..., Wire], tmp_path: Path
) -> None:
    """Single sends are gathered in the store's stage and written together, but never after
    their answer: read from outside the broker process, the file holds every acknowledged
    record the moment its SEND_OK arrives (also for several sends in flight on one connection)."""
    quiet = ["--store-set", "flush_interval_commit_log_ms=60000"]
    quiet += ["--store-set", "flush_commit_log_thorough_interval_ms=60000"]
    broker = start_broker(None, *quiet)
    wire = wires(broker.address)
    log_file = tmp_path / "stores" / "broker-a" / "store" / "commitlog" / ("0" * 20)
    await wire.send_ok("Staged", b"warm-up", queue_id=0)
    for round_ in range(5):
        bodies = [f"round {round_} message {i} ".encode() * 8 for i in range(8)]
        answers = await asyncio.gather(*(wire.send_ok("Staged", b, queue_id=0) for b in bodies))
        fd = os.open(log_file, os.O_RDONLY)
        try:
            for body, ext in zip(bodies, answers, strict=True):
                offset = decode_message_id(ext["msgId"])[2]
                on_disk = os.pread(fd, 88 + len(body), offset)
                assert on_disk[88:] == body, (round_, ext["msgId"])
        finally:
            os.close(fd)


@pytest.mark.asyncio
async def test_a_created_topics_queues_are_made_before_its_first_message(
    start_broker: StartBroker, wires: Callable[..., Wire], tmp_path: Path
) -> None:
    """A topic's ConsumeQueues are made when it is created (off the event loop), not by its
    first sends, and the creation is answered once they are (the store's unit tests show a
    send taking the file made for it)."""
    wire = wires(start_broker(None).address)
    queues = tmp_path / "stores" / "broker-a" / "store" / "consumequeue" / "Wide"
    first = "0" * 20
    assert (await wire.create_topic("Wide", 64)).code == ResponseCode.SUCCESS
    assert sorted(int(q) for q in os.listdir(queues)) == list(range(64))
    assert all((queues / str(q) / first).exists() for q in range(64))
    for q in range(64):
        assert (await wire.send_ok("Wide", b"m%d" % q, queue_id=q))["queueOffset"] == "0"
    assert (await wire.create_topic("Wide", 66)).code == ResponseCode.SUCCESS  # two more queues
    assert all((queues / str(q) / first).exists() for q in (64, 65))
    assert (await wire.send_ok("Wide", b"m65", queue_id=65))["queueOffset"] == "0"


@pytest.mark.asyncio
async def test_a_topic_or_group_is_on_disk_when_its_admin_request_is_answered(
    start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    """The broker saves admin changes to topics and groups off its event loop, and answers once
    they are saved: a kill -9 right after the answers loses none of them."""
    first = start_broker(None)
    w = wires(first.address)
    assert (await w.create_topic("Kept", 3)).code == ResponseCode.SUCCESS
    assert (await w.create_topic("Gone", 2)).code == ResponseCode.SUCCESS
    assert (await w.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Gone"})).code == ResponseCode.SUCCESS
    group = bodies.dumps({"groupName": "kept-group", "consumeEnable": False})
    assert (await w.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, group)).code == ResponseCode.SUCCESS
    first.kill()
    await w.close()
    again = wires(start_broker(None).address)
    table = (await again.topic_table())["topicConfigTable"]
    assert table["Kept"]["writeQueueNums"] == 3
    assert "Gone" not in table
    r = await again.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    groups = bodies.loads_object(r.body_bytes())["subscriptionGroupTable"]
    assert groups["kept-group"]["consumeEnable"] is False


@pytest.mark.asyncio
async def test_send_message_v1_with_long_header_names(wire: Wire) -> None:
    ext = {
        "producerGroup": "pg",
        "topic": "LongNames",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "3",
        "sysFlag": "0",
        "bornTimestamp": "1234",
        "flag": "5",
        "properties": encode_properties({"TAGS": "V1", "KEYS": "key-v1"}).decode(),
        "reconsumeTimes": "2",
        "unitMode": "false",
    }
    r = await wire.call(RequestCode.SEND_MESSAGE, ext, b"v1 body")
    assert r.code == ResponseCode.SUCCESS, r
    assert r.ext_fields is not None
    assert (r.ext_fields["queueId"], r.ext_fields["queueOffset"]) == ("3", "0")
    # The same with RocketMQ's binary header (Java clients' ROCKETMQ serialization).
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=ext, body=b"binary header", serialize_type=1)
    rb = await wire.client.invoke(wire.addr, cmd, 5000)
    assert rb.code == ResponseCode.SUCCESS, rb
    assert rb.serialize_type == 1
    assert rb.ext_fields is not None
    assert rb.ext_fields["queueOffset"] == "1"
    [m, mb] = records(await wire.pull("LongNames", 3, 0))
    assert (mb.body, mb.tags, mb.flag) == (b"binary header", "V1", 5)
    assert (m.body, m.tags, m.keys, m.flag, m.born_timestamp, m.reconsume_times) == (
        b"v1 body",
        "V1",
        ["key-v1"],
        5,
        1234,
        2,
    )
    assert m.msg_id == r.ext_fields["msgId"]


@pytest.mark.asyncio
async def test_a_batch_takes_consecutive_queue_offsets_and_returns_each_id(wire: Wire) -> None:
    first = [(f"batch-1-{i}".encode(), i, {"TAGS": f"t{i}", "KEYS": f"key{i}"}) for i in range(5)]
    second = [(f"batch-2-{i}".encode() * 10, 100 + i, {"n": str(i)}) for i in range(3)]
    r1 = await wire.send_batch("Batched", first, 2)
    assert r1.code == ResponseCode.SUCCESS, r1
    r2 = await wire.send_batch("Batched", second, 2)
    assert r2.code == ResponseCode.SUCCESS, r2
    assert r1.ext_fields is not None
    assert r2.ext_fields is not None
    assert (r1.ext_fields["queueId"], r1.ext_fields["queueOffset"]) == ("2", "0")
    assert r2.ext_fields["queueOffset"] == "5"
    ids = r1.ext_fields["msgId"].split(",") + r2.ext_fields["msgId"].split(",")
    assert len(ids) == 8
    assert len(set(ids)) == 8

    got = records(await wire.pull("Batched", 2, 0))
    assert [m.queue_offset for m in got] == list(range(8))
    assert [m.msg_id for m in got] == ids
    for m, (body, flag, props) in zip(got, first + second, strict=True):
        assert (m.body, m.flag, m.properties, m.queue_id) == (body, flag, props, 2)
    # Each id leads to its own record.
    for m, msg_id in zip(got, ids, strict=True):
        r = await wire.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(decode_message_id(msg_id)[2])})
        assert r.code == ResponseCode.SUCCESS
        assert decode_record(r.body_bytes()).body == m.body


@pytest.mark.asyncio
async def test_a_batch_with_a_property_the_broker_acts_on_goes_the_messages_way(wire: Wire) -> None:
    # DELAY is one of the names a plain batch may not hold: the broker must see the messages.
    items = [(b"now", 0, {"TAGS": "a"}), (b"later", 0, {"DELAY": "3"})]
    r = await wire.send_batch("BatchedDelay", items, 0)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL, r
    assert r.remark is not None
    assert "cannot be sent in a batch" in r.remark
    # Nothing of the batch was written, not even its plain first message.
    assert records(await wire.pull("BatchedDelay", 0, 0)) == []
    ok = await wire.send_batch("BatchedDelay", [(b"plain", 0, {"TAGS": "a"})], 0)
    assert ok.code == ResponseCode.SUCCESS, ok
    assert ok.ext_fields is not None
    assert ok.ext_fields["queueOffset"] == "0"


@pytest.mark.asyncio
async def test_pull_filters_by_tags(wire: Wire, wires: Callable[..., Wire]) -> None:
    tags = ["A", "B", "C", "A", None, "B"]
    for i, t in enumerate(tags):
        await wire.send_ok("Tagged", f"m{i}".encode(), queue_id=0, props={"TAGS": t} if t else {})

    async def pulled(subscription: str | None, group: str = GROUP) -> tuple[list[int], RemotingCommand]:
        r = await wire.pull("Tagged", 0, 0, subscription=subscription, group=group)
        if r.code != ResponseCode.SUCCESS:
            return [], r
        return [m.queue_offset for m in records(r)], r

    offsets, r = await pulled("A || B")
    assert offsets == [0, 1, 3, 5]
    assert r.ext_fields is not None
    assert r.ext_fields["nextBeginOffset"] == "6"
    assert (await pulled("C"))[0] == [2]
    assert (await pulled("*"))[0] == list(range(6))
    assert (await pulled(""))[0] == list(range(6))
    # Without the subscription bit and with no registered subscription: every message.
    assert (await pulled(None))[0] == list(range(6))
    # Nothing matches: retry from the next offset.
    offsets, r = await pulled("Z")
    assert offsets == []
    assert r.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert r.ext_fields is not None
    assert r.ext_fields["nextBeginOffset"] == "6"

    # Tags beyond ASCII hash as Java's String.hashCode does, on the store's side and the pull's.
    for i, t in enumerate(("标签", "tag-😀", "Ünïcode")):
        await wire.send_ok("Tagged", f"u{i}".encode(), queue_id=0, props={"TAGS": t})
    r = await wire.pull("Tagged", 0, 6, subscription="标签 || tag-😀")
    assert [m.body for m in records(r)] == [b"u0", b"u1"]
    r = await wire.pull("Tagged", 0, 6, subscription="Ünïcode")
    assert [m.body for m in records(r)] == [b"u2"]
    # Tag expressions and SQL92 (docs/filters_and_trace.md); a bad SQL92 expression is refused.
    r = await wire.call(
        RequestCode.PULL_MESSAGE,
        {"consumerGroup": GROUP, "topic": "Tagged", "queueId": "0", "queueOffset": "0", "sysFlag": "4"}
        | {"subscription": "a >", "expressionType": "SQL92"},
    )
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED

    # Without the subscription bit the broker uses the subscription the group's heartbeat gave.
    hb = await wires(wire.addr).heartbeat("client-c", group="only-c", topic="Tagged", sub="C")
    assert hb.code == ResponseCode.SUCCESS, hb
    assert (await pulled(None, group="only-c"))[0] == [2]


# --- the process ----------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_the_served_broker_keeps_its_startup_objects_out_of_every_collection(wire: Wire) -> None:
    """``orbit broker`` freezes what exists once it serves (gc_watch.py): the modules, config
    and store objects (tens of thousands) are no longer walked by a full collection."""
    info = await wire.runtime()
    assert int(info["gcFrozenObjects"]) > 10_000, info
    assert {"maxGcPauseMs", "gcFullCollections"} <= info.keys()


@pytest.mark.asyncio
async def test_the_served_broker_watches_its_loop_for_stalls(wire: Wire) -> None:
    """The stall watch (stall_watch.py) runs in the served broker: its figures are runtime info."""
    info = await wire.runtime()
    assert int(info["loopStalls"]) >= 0, info
    assert int(info["lastLoopStallMs"]) >= 0, info
    assert (int(info["loopStalls"]) == 0) == (info["lastLoopStallAt"] == ""), info
    # The loop-stall gauge (data_plane/loop_stall.py), from start-up on.
    assert int(info["loopStallsOver100ms"]) >= 0, info
    assert int(info["loopStallMaxMs"]) >= 0, info


@pytest.mark.asyncio
async def test_the_served_broker_hands_the_gil_to_its_store_threads_within_its_switch_interval(
    broker: ServerProcess, wire: Wire, start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    """``orbit broker`` sets the process's GIL switch interval (gil_switch_interval_us, 500 us
    unless configured): CPython's 5 ms would let a busy loop keep a group commit waiting."""
    assert int((await wire.runtime())["gilSwitchIntervalUs"]) == 500
    other = start_broker(None, "--set", "gil_switch_interval_us=1200", "--set", "answer_slice=0", name="broker-b")
    assert int((await wires(other.address).runtime())["gilSwitchIntervalUs"]) == 1200
    # And the slice its connections answer in (tests/integration/test_remoting_connection.py).
    assert int((await wire.runtime())["answerSlice"]) == 4
    assert int((await wires(other.address).runtime())["answerSlice"]) == 0


# --- long polling -----------------------------------------------------------------------------
async def held_pulls(w: Wire) -> int:
    return int((await w.runtime())["heldPullRequests"])


@pytest.mark.asyncio
async def test_a_held_pull_is_answered_as_soon_as_a_message_arrives(wire: Wire, wires: Callable[..., Wire]) -> None:
    assert (await wire.create_topic("LongPoll", 2)).code == ResponseCode.SUCCESS
    producer = wires(wire.addr)
    pull = asyncio.create_task(wire.pull("LongPoll", 0, 0, suspend_ms=10_000, timeout_ms=20_000))
    assert await poll(lambda: _eq(held_pulls(producer), 1))

    await producer.send_ok("LongPoll", b"elsewhere", queue_id=1)  # another queue: no wake-up
    assert await held_pulls(producer) == 1
    assert not pull.done()

    t0 = time.monotonic()
    await producer.send_ok("LongPoll", b"wake up", queue_id=0)
    r = await asyncio.wait_for(pull, 5)
    elapsed = time.monotonic() - t0
    assert r.code == ResponseCode.SUCCESS, r
    assert [m.body for m in records(r)] == [b"wake up"]
    assert elapsed < 1.0, f"the held pull was answered {elapsed:.3f} s after the send"
    assert await held_pulls(producer) == 0


@pytest.mark.asyncio
async def test_a_pull_held_for_a_consumer_that_went_away_delivers_nothing(
    wire: Wire, wires: Callable[..., Wire]
) -> None:
    """The consumer's connection closes while its pull is held: the broker lets go of the pull
    at once (not after its 10 s suspend time), and the next message is not read for it — no
    delivery counted (nor metered, nor traced) for a client that is gone."""
    assert (await wire.create_topic("LongPollGone", 1)).code == ResponseCode.SUCCESS
    gone = wires(wire.addr)
    pull = asyncio.create_task(gone.pull("LongPollGone", 0, 0, suspend_ms=10_000, timeout_ms=20_000))
    assert await poll(lambda: _eq(held_pulls(wire), 1))
    delivered = int((await wire.runtime())["getMessageTimesTotal"])
    t0 = time.monotonic()
    await gone.close()
    with contextlib.suppress(Exception):
        await pull  # failed by the close, on the client's side
    assert await poll(lambda: _eq(held_pulls(wire), 0))
    assert time.monotonic() - t0 < 5.0

    await wire.send_ok("LongPollGone", b"for nobody", queue_id=0)
    assert int((await wire.runtime())["getMessageTimesTotal"]) == delivered
    r = await wire.pull("LongPollGone", 0, 0)  # the message is there for the next consumer
    assert [m.body for m in records(r)] == [b"for nobody"]
    assert int((await wire.runtime())["getMessageTimesTotal"]) == delivered + 1


@pytest.mark.asyncio
async def test_a_delayed_or_half_message_does_not_wake_a_pull_held_on_its_real_queue(
    wire: Wire, wires: Callable[..., Wire]
) -> None:
    """Such a message is stored in a system topic's queue (schedule, transaction half); the
    pulls of its real queue wake when it reaches that queue, not at the send."""
    assert (await wire.create_topic("LongPollLater", 1)).code == ResponseCode.SUCCESS
    producer = wires(wire.addr)
    pull = asyncio.create_task(wire.pull("LongPollLater", 0, 0, suspend_ms=10_000, timeout_ms=20_000))
    assert await poll(lambda: _eq(held_pulls(producer), 1))
    await producer.send_ok("LongPollLater", b"in 10 s", queue_id=0, props={"DELAY": "3"})
    await producer.send_ok("LongPollLater", b"half", queue_id=0, props={"TRAN_MSG": "true", "PGROUP": "pg"})
    assert await held_pulls(producer) == 1  # notified synchronously with the append: still held
    assert not pull.done()

    await producer.send_ok("LongPollLater", b"now", queue_id=0)
    r = await asyncio.wait_for(pull, 5)
    assert r.code == ResponseCode.SUCCESS, r
    assert [(m.body, m.queue_offset) for m in records(r)] == [(b"now", 0)]


@pytest.mark.asyncio
async def test_a_held_pull_wakes_only_for_its_tags(wire: Wire, wires: Callable[..., Wire]) -> None:
    assert (await wire.create_topic("LongPollTags", 1)).code == ResponseCode.SUCCESS
    producer = wires(wire.addr)
    pull = asyncio.create_task(wire.pull("LongPollTags", 0, 0, subscription="A", suspend_ms=10_000, timeout_ms=20_000))
    assert await poll(lambda: _eq(held_pulls(producer), 1))
    await producer.send_ok("LongPollTags", b"tag B", queue_id=0, props={"TAGS": "B"})
    assert await held_pulls(producer) == 1  # notified synchronously with the append: still held
    assert not pull.done()

    t0 = time.monotonic()
    await producer.send_ok("LongPollTags", b"tag A", queue_id=0, props={"TAGS": "A"})
    r = await asyncio.wait_for(pull, 5)
    assert time.monotonic() - t0 < 1.0
    assert r.code == ResponseCode.SUCCESS, r
    assert [(m.body, m.queue_offset) for m in records(r)] == [(b"tag A", 1)]


@pytest.mark.asyncio
async def test_a_batch_wakes_a_pull_waiting_for_any_of_its_tags(wire: Wire, wires: Callable[..., Wire]) -> None:
    assert (await wire.create_topic("LongPollBatch", 1)).code == ResponseCode.SUCCESS
    producer = wires(wire.addr)
    pull = asyncio.create_task(wire.pull("LongPollBatch", 0, 0, subscription="A", suspend_ms=10_000, timeout_ms=20_000))
    assert await poll(lambda: _eq(held_pulls(producer), 1))
    t0 = time.monotonic()
    # The wanted tag is not the batch's last one.
    r = await producer.send_batch("LongPollBatch", [(b"first A", 0, {"TAGS": "A"}), (b"then B", 0, {"TAGS": "B"})], 0)
    assert r.code == ResponseCode.SUCCESS, r
    got = await asyncio.wait_for(pull, 15)
    elapsed = time.monotonic() - t0
    assert got.code == ResponseCode.SUCCESS, got
    assert [m.body for m in records(got)] == [b"first A"]
    assert elapsed < 1.0, f"the held pull was answered {elapsed:.3f} s after the batch"


@pytest.mark.asyncio
async def test_a_held_pull_with_nothing_arriving_ends_not_found_after_its_suspend_time(wire: Wire) -> None:
    assert (await wire.create_topic("Quiet", 1)).code == ResponseCode.SUCCESS
    t0 = time.monotonic()
    r = await wire.pull("Quiet", 0, 0, suspend_ms=800, timeout_ms=10_000)
    elapsed = time.monotonic() - t0
    assert r.code == ResponseCode.PULL_NOT_FOUND, r
    assert 0.7 <= elapsed < 3.0, elapsed
    # Without the suspend bit the answer is immediate.
    t0 = time.monotonic()
    r = await wire.pull("Quiet", 0, 0)
    assert r.code == ResponseCode.PULL_NOT_FOUND
    assert time.monotonic() - t0 < 0.5
    # At the end of a queue with messages: not found, the next offset stays.
    await wire.send_ok("Quiet", b"one", queue_id=0)
    r = await wire.pull("Quiet", 0, 1)
    assert r.code == ResponseCode.PULL_NOT_FOUND
    assert r.ext_fields is not None
    assert r.ext_fields["nextBeginOffset"] == "1"
    # Past the end: the offset moved; RocketMQ sends a queue whose min offset is 0 back to 0.
    r = await wire.pull("Quiet", 0, 5)
    assert r.code == ResponseCode.PULL_OFFSET_MOVED
    assert r.ext_fields is not None
    assert (r.ext_fields["nextBeginOffset"], r.ext_fields["maxOffset"]) == ("0", "1")


# --- offsets ----------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_consumer_offsets_update_and_query(wire: Wire) -> None:
    assert (await wire.create_topic("Offsets", 2)).code == ResponseCode.SUCCESS
    q = RequestCode.QUERY_CONSUMER_OFFSET
    # A group new to an empty (young) queue starts at 0.
    assert await wire.offset_of(q, "Offsets", 0, consumerGroup=GROUP) == 0

    update = {"consumerGroup": GROUP, "topic": "Offsets", "queueId": "1", "commitOffset": "42"}
    assert (await wire.call(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
    assert await wire.offset_of(q, "Offsets", 1, consumerGroup=GROUP) == 42
    assert await wire.offset_of(q, "Offsets", 0, consumerGroup=GROUP) == 0
    update["commitOffset"] = "40"  # a reset backwards is kept as it is
    assert (await wire.call(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
    assert await wire.offset_of(q, "Offsets", 1, consumerGroup=GROUP) == 40

    # A pull may carry a commit.
    await wire.send_ok("Offsets", b"x", queue_id=0)
    r = await wire.pull("Offsets", 0, 0, commit_offset=7)
    assert r.code == ResponseCode.SUCCESS
    assert await wire.offset_of(q, "Offsets", 0, consumerGroup=GROUP) == 7

    bad = await wire.call(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": GROUP, "topic": "NoSuch", "queueId": "0", "commitOffset": "1"},
    )
    assert bad.code == ResponseCode.TOPIC_NOT_EXIST
    missing = await wire.call(
        RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": "Offsets", "queueId": "0"}
    )
    assert missing.code == ResponseCode.SYSTEM_ERROR
    assert "'commitOffset'" in (missing.remark or "")


@pytest.mark.asyncio
async def test_queue_offsets_and_search_by_timestamp(wire: Wire) -> None:
    for i in range(5):
        await wire.send_ok("Timed", f"m{i}".encode(), queue_id=0)
        await asyncio.sleep(0.003)  # a later store time (milliseconds) for the next message
    got = records(await wire.pull("Timed", 0, 0))
    stamps = [m.store_timestamp for m in got]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == 5

    assert await wire.offset_of(RequestCode.GET_MAX_OFFSET, "Timed", 0) == 5
    assert await wire.offset_of(RequestCode.GET_MIN_OFFSET, "Timed", 0) == 0
    assert await wire.offset_of(RequestCode.GET_MAX_OFFSET, "Timed", 1) == 0
    assert await wire.offset_of(RequestCode.GET_MAX_OFFSET, "NeverWritten", 0) == 0

    search = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
    assert await wire.offset_of(search, "Timed", 0, timestamp="0") == 0
    for i, ts in enumerate(stamps):
        assert await wire.offset_of(search, "Timed", 0, timestamp=str(ts)) == i
        assert await wire.offset_of(search, "Timed", 0, timestamp=str(ts + 1)) == i + 1
    r = await wire.call(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "Timed", "queueId": "0"})
    assert r.ext_fields is not None
    assert int(r.ext_fields["timestamp"]) == stamps[0]


@pytest.mark.asyncio
async def test_view_message_by_id_and_query_by_key(wire: Wire) -> None:
    e1 = await wire.send_ok("Lookup", b"order one", queue_id=0, props={"KEYS": "order-1 shared"})
    e2 = await wire.send_ok("Lookup", b"order two", queue_id=1, props={"KEYS": "order-2 shared"})
    await wire.send_ok("OtherTopic", b"not me", queue_id=0, props={"KEYS": "shared"})

    offset = decode_message_id(e1["msgId"])[2]
    r = await wire.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)})
    assert r.code == ResponseCode.SUCCESS
    m = decode_record(r.body_bytes())
    assert (m.body, m.keys, m.msg_id) == (b"order one", ["order-1", "shared"], e1["msgId"])
    r = await wire.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset + 1)})  # not a record's start
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await wire.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(10**12)})
    assert r.code == ResponseCode.SYSTEM_ERROR

    async def by_key(key: str, topic: str = "Lookup") -> list[str]:
        ext = {"topic": topic, "key": key, "maxNum": "32", "beginTimestamp": "0", "endTimestamp": str(2**62)}
        r = await wire.call(RequestCode.QUERY_MESSAGE, ext)
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        assert r.code == ResponseCode.SUCCESS, r
        return sorted(m.msg_id for m in records(r))

    assert await by_key("order-2") == [e2["msgId"]]
    assert await by_key("shared") == sorted([e1["msgId"], e2["msgId"]])
    assert await by_key("nobody") == []
    assert len(await by_key("shared", "OtherTopic")) == 1


# --- clients ----------------------------------------------------------------------------------
CLIENT_SCRIPT = """
import asyncio, sys
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.command import RemotingCommand
async def main():
    c = RemotingClient()
    r = await c.invoke(sys.argv[1], RemotingCommand(34, body=sys.argv[2].encode()), 5000)
    print("code", r.code, flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_consumers_join_and_leave_and_the_group_is_told(
    broker: ServerProcess, wires: Callable[..., Wire]
) -> None:
    notices_a = Notices()
    a = wires(broker.address, notices_a.processors)
    assert (await a.heartbeat("client-A", topic="Members")).code == ResponseCode.SUCCESS
    assert await a.consumer_ids() == ["client-A"]
    notice = await notices_a.next()  # its own arrival
    assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
    assert notice.ext_fields == {"consumerGroup": GROUP}
    # A clustering consumer group gets its retry topic.
    assert "%RETRY%cg" in (await a.topic_table())["topicConfigTable"]
    # A heartbeat that changes nothing tells nobody.
    assert (await a.heartbeat("client-A", topic="Members")).code == ResponseCode.SUCCESS

    b = wires(broker.address)
    assert (await b.heartbeat("client-B", topic="Members")).code == ResponseCode.SUCCESS
    assert (await notices_a.next()).ext_fields == {"consumerGroup": GROUP}
    assert notices_a.drain() == 0
    assert await a.consumer_ids() == ["client-A", "client-B"]

    # B's connection closes: it leaves at once and A hears of it.
    await b.close()
    assert (await notices_a.next()).ext_fields == {"consumerGroup": GROUP}
    assert await a.consumer_ids() == ["client-A"]

    # A client process that dies (kill -9) leaves as well.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT_SCRIPT,
        broker.address,
        heartbeat_body("client-P", topic="Members").decode(),
        cwd=str(REPO),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S)
        assert line.strip() == b"code 0"
        assert await a.consumer_ids() == ["client-A", "client-P"]
        await notices_a.next()
        proc.kill()
        await proc.wait()
        await notices_a.next()
        assert await a.consumer_ids() == ["client-A"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    # Saying goodbye works too; the group is then empty.
    r = await a.call(
        RequestCode.UNREGISTER_CLIENT, {"clientID": "client-A", "consumerGroup": GROUP, "producerGroup": "pg"}
    )
    assert r.code == ResponseCode.SUCCESS
    r = await a.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "no consumer" in (r.remark or "")


@pytest.mark.asyncio
async def test_a_heartbeat_without_a_client_id_is_refused(wire: Wire) -> None:
    r = await wire.call(RequestCode.HEART_BEAT, body=bodies.dumps({"consumerDataSet": []}))
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "clientID" in (r.remark or "")
    r = await wire.call(RequestCode.HEART_BEAT, body=b"{not json")
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert (await wire.heartbeat("fine")).code == ResponseCode.SUCCESS


@pytest.mark.asyncio
async def test_queue_locks_are_exclusive_between_clients(broker: ServerProcess, wires: Callable[..., Wire]) -> None:
    c1, c2 = wires(broker.address), wires(broker.address)
    assert await c1.lock("client-1", [0, 1]) == [0, 1]
    assert await c2.lock("client-2", [1, 2]) == [2]
    assert await c1.lock("client-1", [0, 1, 2]) == [0, 1]  # renews its own, not client-2's
    await c2.lock("client-2", [0, 1], unlock=True)  # not the holder: ignored
    assert await c2.lock("client-2", [0, 1]) == []
    await c1.lock("client-1", [1], unlock=True)
    assert await c2.lock("client-2", [0, 1]) == [1]
    assert await c1.lock("client-1", [0, 1, 2]) == [0]

    r = await c1.call(RequestCode.LOCK_BATCH_MQ, body=bodies.dumps({"clientId": "x", "mqSet": []}))
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "consumerGroup" in (r.remark or "")


@pytest.mark.asyncio
async def test_a_silent_consumer_expires_and_the_group_is_told(
    start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    b = start_broker(None, "--set", "channel_expired_s=1", "--set", "client_scan_interval_s=0.2")
    notices = Notices()
    alive, silent = wires(b.address, notices.processors), wires(b.address)
    assert (await alive.heartbeat("alive")).code == ResponseCode.SUCCESS
    assert (await silent.heartbeat("silent")).code == ResponseCode.SUCCESS
    assert await alive.consumer_ids() == ["alive", "silent"]
    silent_conn = await silent.connection()
    notices.drain()

    async def keep_beating() -> None:
        while True:
            await alive.heartbeat("alive")
            await asyncio.sleep(0.2)

    beating = asyncio.create_task(keep_beating())
    try:
        assert await poll(lambda: _same(alive.consumer_ids(), ["alive"]), 5.0)
        assert (await notices.next()).ext_fields == {"consumerGroup": GROUP}
        assert await poll(lambda: _true(silent_conn.closed), 5.0)  # the broker closed it
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating


# --- topics -----------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_create_update_and_list_topics(wire: Wire) -> None:
    before = await wire.topic_table()
    assert {"TBW102", "broker-a", "SELF_TEST_TOPIC"} <= set(before["topicConfigTable"])
    r = await wire.create_topic("Made", 3, 5, order="true")
    assert r.code == ResponseCode.SUCCESS, r
    after = await wire.topic_table()
    assert after["topicConfigTable"]["Made"] == {
        "topicName": "Made",
        "readQueueNums": 3,
        "writeQueueNums": 5,
        "perm": 6,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": True,
    }
    assert after["dataVersion"]["counter"] > before["dataVersion"]["counter"]

    assert (await wire.send_ok("Made", b"q4", queue_id=4))["queueId"] == "4"
    r = await wire.send("Made", b"q5", queue_id=5)
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "queueId[5]" in (r.remark or "")
    r = await wire.pull("Made", 3, 0)
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "queueId[3]" in (r.remark or "")
    assert (await wire.pull("Made", 2, 0)).code == ResponseCode.PULL_NOT_FOUND

    # Read-only now: sends are refused.
    assert (await wire.create_topic("Made", 3, 5, perm="4")).code == ResponseCode.SUCCESS
    assert (await wire.send("Made", b"no", queue_id=0)).code == ResponseCode.NO_PERMISSION

    for ext, says in (
        ({"topic": "TBW102"}, "reserved"),
        ({"topic": "bad name"}, "characters outside"),
        ({"topic": "Fine", "readQueueNums": "0"}, "'readQueueNums'"),
        ({"topic": "Fine", "perm": "9"}, "'perm'"),
        ({"readQueueNums": "1"}, "'topic'"),
    ):
        r = await wire.call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        assert r.code == ResponseCode.SYSTEM_ERROR, (ext, r)
        assert says in (r.remark or ""), (ext, r.remark)
    assert "Fine" not in (await wire.topic_table())["topicConfigTable"]

    assert (await wire.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Made"})).code == ResponseCode.SUCCESS
    assert "Made" not in (await wire.topic_table())["topicConfigTable"]
    r = await wire.call(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "Made", "e": "0"}, b"gone")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert (await wire.pull("Made", 0, 0)).code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.asyncio
async def test_a_group_that_may_not_consume_is_refused(wire: Wire) -> None:
    await wire.send_ok("GroupPerm", b"x", queue_id=0)
    body = bodies.dumps({"groupName": "stopped", "consumeEnable": False})
    assert (await wire.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == ResponseCode.SUCCESS
    r = await wire.pull("GroupPerm", 0, 0, group="stopped")
    assert r.code == ResponseCode.NO_PERMISSION
    r = await wire.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert bodies.loads_object(r.body_bytes())["subscriptionGroupTable"]["stopped"]["consumeEnable"] is False
    assert (await wire.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "stopped"})).code == 0
    assert (await wire.pull("GroupPerm", 0, 0, group="stopped")).code == ResponseCode.SUCCESS


@pytest.mark.asyncio
async def test_without_auto_creation_unknown_topics_and_groups_are_refused(
    start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    b = start_broker(None, "--set", "auto_create_topic_enable=false", "--set", "auto_create_subscription_group=false")
    w = wires(b.address)
    r = await w.send("NotCreated", b"x")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert "NotCreated" not in (await w.topic_table())["topicConfigTable"]
    r = await w.heartbeat("c", group="unknown-group")
    assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert (await w.create_topic("Created", 1)).code == ResponseCode.SUCCESS
    await w.send_ok("Created", b"x")


@pytest.mark.asyncio
async def test_a_slave_refuses_sends(start_broker: StartBroker, wires: Callable[..., Wire]) -> None:
    b = start_broker(None, "--role", "SLAVE", "--broker-id", "1")
    w = wires(b.address)
    r = await w.send("AnyTopic", b"x")
    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "slave" in (r.remark or "")


# --- bad input --------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_bad_requests_get_clear_errors_and_the_connection_keeps_working(wire: Wire) -> None:
    await wire.send_ok("Bad", b"first", queue_id=0)
    conn = await wire.connection()

    r = await wire.call(9999)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    r = await wire.call(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "e": "0"}, b"no topic")
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "'topic'" in (r.remark or "")
    r = await wire.call(RequestCode.PULL_MESSAGE, {"topic": "Bad", "queueId": "0", "queueOffset": "0"})
    assert "'consumerGroup'" in (r.remark or "")
    r = await wire.call(
        RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "Bad", "queueId": "0", "queueOffset": "x"}
    )
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "'queueOffset'" in (r.remark or "")
    r = await wire.send("Bad", b"far queue", queue_id=99)
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert "queueId" in (r.remark or "")
    r = await wire.send("Bad", b"", queue_id=0)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    r = await wire.send("Bad", b"x" * (4 * 1024 * 1024 + 1), queue_id=0)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    r = await wire.send("Bad", b"big props", queue_id=0, props={"p": "v" * 40_000})
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    r = await wire.send("bad topic name", b"x")
    assert r.code == ResponseCode.MESSAGE_ILLEGAL

    ext = {"a": "pg", "b": "Bad", "e": "0", "i": "TAGS\x01A\x02\x01\x02"}  # a property without a name
    r = await wire.call(RequestCode.SEND_MESSAGE_V2, ext, b"bad props")
    assert r.code != ResponseCode.SUCCESS
    batch_ext = {"a": "pg", "b": "Bad", "e": "0", "m": "true"}
    good_item = bodies.encode_batch_item(b"ok", 0, b"")
    for body in (b"garbage that is not a batch", good_item[:-1], good_item + b"\x00\x00", b"\x00" * 22):
        r = await wire.call(RequestCode.SEND_BATCH_MESSAGE, batch_ext, body)
        assert r.code == ResponseCode.SYSTEM_ERROR, body
        assert "batch" in (r.remark or "")
    bad_item = bodies.encode_batch_item(b"ok", 0, b"\x01\x02")
    r = await wire.call(RequestCode.SEND_BATCH_MESSAGE, batch_ext, good_item + bad_item)
    assert r.code != ResponseCode.SUCCESS

    # Nothing of the refused sends was stored, and the same connection still serves.
    assert await wire.offset_of(RequestCode.GET_MAX_OFFSET, "Bad", 0) == 1
    assert await wire.connection() is conn
    assert not conn.closed
    await wire.send_ok("Bad", b"second", queue_id=0)
    assert [m.body for m in records(await wire.pull("Bad", 0, 0))] == [b"first", b"second"]


@pytest.mark.asyncio
async def test_garbage_bytes_close_only_their_own_connection(broker: ServerProcess, wire: Wire) -> None:
    host, _, port = broker.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"\x00\x00\x00\x02hi")  # a frame too short to hold its header length
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # closed by the broker
    writer.close()
    await wire.send_ok("StillHere", b"x")


@pytest.mark.asyncio
async def test_a_stalled_client_does_not_block_others(broker: ServerProcess, wire: Wire) -> None:
    big = b"z" * (200 * 1024)
    for _ in range(4):
        await wire.send_ok("Big", big, queue_id=0, queue_nums=1)
    # A raw socket asks for ~20 MB of pull answers and never reads one.
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, _, port = broker.address.rpartition(":")
    stalled.connect((host, int(port)))
    try:
        frames = b"".join(
            encode_bytes(
                RemotingCommand(
                    RequestCode.PULL_MESSAGE,
                    opaque=i + 1,
                    ext_fields={
                        "consumerGroup": "stall",
                        "topic": "Big",
                        "queueId": "0",
                        "queueOffset": str(i % 4),
                        "maxMsgNums": "1",
                        "sysFlag": str(SUB_ALL),
                        "subscription": "*",
                    },
                )
            )
            for i in range(100)
        )
        stalled.sendall(frames)
        # Meanwhile another client is served as usual.
        t0 = time.monotonic()
        for i in range(20):
            ext = await wire.send_ok("Other", f"n{i}".encode(), queue_id=0)
            r = await wire.pull("Other", 0, int(ext["queueOffset"]))
            assert r.code == ResponseCode.SUCCESS
            assert records(r)[0].body == f"n{i}".encode()
        assert time.monotonic() - t0 < 5.0
        # The stalled client has answers waiting for it that it never read.
        stalled.settimeout(5)
        assert len(stalled.recv(4096, socket.MSG_PEEK)) > 0
    finally:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stalled.close()  # a reset, with answers still unread
    await wire.send_ok("Other", b"after", queue_id=0)
    r = await wire.pull("Big", 0, 3)
    assert records(r)[0].body == big


# --- restarts ---------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_topics_offsets_groups_and_messages_survive_a_restart(
    start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    first = start_broker(None)
    w = wires(first.address)
    assert (await w.create_topic("Keep", 3)).code == ResponseCode.SUCCESS
    sent = []
    for i in range(12):
        ext = await w.send_ok("Keep", f"keep-{i}".encode() * (i + 1), queue_id=i % 3, props={"KEYS": f"k{i}"})
        sent.append(ext)
    update = {"consumerGroup": GROUP, "topic": "Keep", "queueId": "2", "commitOffset": "3"}
    assert (await w.call(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
    group_body = bodies.dumps({"groupName": "kg", "retryMaxTimes": 3, "consumeEnable": True})
    assert (await w.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=group_body)).code == 0
    before = {q: raw_records(await w.pull("Keep", q, 0)) for q in range(3)}
    assert sum(len(v) for v in before.values()) == 12
    # Consumers are connected while the broker stops.
    notices = Notices()
    c1, c2 = wires(first.address, notices.processors), wires(first.address)
    await c1.heartbeat("c1")
    await c2.heartbeat("c2")
    # And a pull is held.
    held = asyncio.create_task(c2.pull("Keep", 0, 4, suspend_ms=30_000, timeout_ms=60_000))
    assert await poll(lambda: _eq(held_pulls(w), 1))
    await w.close()

    assert first.stop() == 0
    assert "Traceback" not in first.log_text()
    # The held pull ended with the broker (answered or cut off), not at its suspend time.
    done, _ = await asyncio.wait([held], timeout=5)
    assert done
    if held.exception() is None:
        assert held.result().code == ResponseCode.PULL_NOT_FOUND
    else:
        assert isinstance(held.exception(), RemotingError)
    await c1.close()
    await c2.close()

    second = start_broker(None)
    assert second.port != first.port or second.proc.pid != first.proc.pid
    w2 = wires(second.address)
    table = (await w2.topic_table())["topicConfigTable"]
    assert (table["Keep"]["readQueueNums"], table["Keep"]["writeQueueNums"]) == (3, 3)
    assert "%RETRY%cg" in table
    assert await w2.offset_of(RequestCode.QUERY_CONSUMER_OFFSET, "Keep", 2, consumerGroup=GROUP) == 3
    after = {q: raw_records(await w2.pull("Keep", q, 0)) for q in range(3)}
    assert after == before  # byte for byte
    for ext in sent:
        r = await w2.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(decode_message_id(ext["msgId"])[2])})
        assert r.code == ResponseCode.SUCCESS
    r = await w2.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert bodies.loads_object(r.body_bytes())["subscriptionGroupTable"]["kg"]["retryMaxTimes"] == 3
    # Queue offsets go on from where they were.
    assert (await w2.send_ok("Keep", b"new", queue_id=0))["queueOffset"] == "4"


@pytest.mark.asyncio
async def test_committed_offsets_reach_disk_within_the_persist_interval(
    start_broker: StartBroker, wires: Callable[..., Wire], tmp_path: Path
) -> None:
    first = start_broker(None)
    w = wires(first.address)
    assert (await w.create_topic("Commit", 1)).code == ResponseCode.SUCCESS
    update = {"consumerGroup": GROUP, "topic": "Commit", "queueId": "0", "commitOffset": "123"}
    assert (await w.call(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
    path = tmp_path / "stores" / "broker-a" / "config" / "consumerOffset.json"

    async def on_disk() -> bool:
        with contextlib.suppress(OSError, ValueError):
            return bool(json.loads(path.read_text())["offsetTable"]["Commit@cg"]["0"] == 123)
        return False

    assert await poll(on_disk, 5.0)
    first.kill()
    await w.close()
    second = start_broker(None)
    w2 = wires(second.address)
    assert await w2.offset_of(RequestCode.QUERY_CONSUMER_OFFSET, "Commit", 0, consumerGroup=GROUP) == 123


@pytest.mark.asyncio
async def test_a_client_sys_flag_cannot_make_records_unreadable(
    start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    """The IPv6-host bits of sysFlag describe the record's host fields, which the broker
    writes (IPv4); taken from a client they would make the record unreadable, and recovery
    would cut the log there, dropping every later message."""
    first = start_broker(None)
    w = wires(first.address)
    for i, sys_flag in enumerate(("0", "48", "0")):  # 48 = born host v6 | store host v6
        ext = {"a": "pg", "b": "Flags", "c": "TBW102", "d": "1", "e": "0", "f": sys_flag}
        r = await w.call(RequestCode.SEND_MESSAGE_V2, ext, f"m{i}".encode())
        assert r.code == ResponseCode.SUCCESS, r
    got = records(await w.pull("Flags", 0, 0))  # every record decodes
    assert [(m.body, m.sys_flag) for m in got] == [(b"m0", 0), (b"m1", 0), (b"m2", 0)]
    first.kill()
    await w.close()
    second = start_broker(None)
    assert [m.body for m in await wires(second.address).pull_all("Flags", 0)] == [b"m0", b"m1", b"m2"]


@pytest.mark.asyncio
async def test_sync_flush_keeps_every_acknowledged_message_through_kill_9(
    start_broker: StartBroker, wires: Callable[..., Wire], seed: int
) -> None:
    rng = random.Random(seed)
    first = start_broker(None, "--flush", "SYNC_FLUSH")
    admin = wires(first.address)
    assert (await admin.create_topic("Durable", 4)).code == ResponseCode.SUCCESS
    acked: dict[tuple[int, int], tuple[bytes, str]] = {}
    enough = asyncio.Event()
    errors: list[BaseException] = []

    async def sender(w: Wire, task_no: int, trng: random.Random) -> None:
        n = 0
        while True:
            body = f"t{task_no}-{n}-".encode() + trng.randbytes(trng.randrange(1, 3000))
            n += 1
            try:
                r = await w.send("Durable", body, queue_id=trng.randrange(4), timeout_ms=3000)
            except RemotingError:
                return  # the broker is gone
            if r.code != ResponseCode.SUCCESS:
                errors.append(AssertionError(f"send refused: {r}"))
                return
            assert r.ext_fields is not None
            acked[(int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))] = (body, r.ext_fields["msgId"])
            if len(acked) >= 1000:
                enough.set()

    clients = [wires(first.address) for _ in range(4)]
    tasks = [asyncio.create_task(sender(clients[i % 4], i, random.Random(rng.randrange(2**32)))) for i in range(8)]
    await asyncio.wait_for(enough.wait(), 30)
    first.kill()  # kill -9 while the senders are still sending
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert not errors, errors
    assert len(acked) >= 1000

    second = start_broker(None, "--flush", "SYNC_FLUSH")
    reader = wires(second.address)
    stored: dict[tuple[int, int], StoredMessage] = {}
    for q in range(4):
        got = await reader.pull_all("Durable", q)
        assert [m.queue_offset for m in got] == list(range(len(got)))  # no holes
        stored.update(((q, m.queue_offset), m) for m in got)
    lost = sorted(k for k in acked if k not in stored)
    assert not lost, f"{len(lost)} acknowledged messages lost, first {lost[:5]}"
    for key, (body, msg_id) in acked.items():
        m = stored[key]
        assert m.body == body, key
        assert decode_message_id(msg_id)[2] == m.commit_log_offset


# --- name server ----------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_broker_registers_its_topics_with_the_name_server(
    start_namesrv: Callable[..., ServerProcess], start_broker: StartBroker, wires: Callable[..., Wire]
) -> None:
    ns = start_namesrv()
    b = start_broker(ns.address)
    w = wires(b.address)
    assert (await w.create_topic("Routed", 3, 5)).code == ResponseCode.SUCCESS
    names = wires(ns.address)
    route: dict[str, Any] = {}

    async def routed() -> bool:
        r = await names.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Routed"})
        if r.code != ResponseCode.SUCCESS:
            return False
        route.update(bodies.loads_object(r.body_bytes()))
        return True

    assert await poll(routed), "the topic never reached the name server"
    [qd] = route["queueDatas"]
    assert (qd["brokerName"], qd["readQueueNums"], qd["writeQueueNums"], qd["perm"]) == ("broker-a", 3, 5, 6)
    [bd] = route["brokerDatas"]
    assert bd["brokerName"] == "broker-a"
    assert bd["cluster"] == "DefaultCluster"
    assert bd["brokerAddrs"] == {"0": b.address}

    # A clean stop unregisters the broker: its topics leave the name server.
    await w.close()
    assert b.stop() == 0

    async def gone() -> bool:
        r = await names.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Routed"})
        return r.code == ResponseCode.TOPIC_NOT_EXIST

    assert await poll(gone)


def test_a_bad_store_setting_is_a_clear_config_error(tmp_path: Path) -> None:
    import subprocess

    args = [
        sys.executable,
        "-m",
        "data_plane.cli",
        "broker",
        "--listen",
        "127.0.0.1:0",
        "--store-dir",
        str(tmp_path / "s"),
        "--store-set",
        "commit_log_file_size_bytes=100",
    ]
    p = subprocess.run(args, cwd=REPO, capture_output=True, timeout=60, check=False)
    assert p.returncode == 2, p.stderr
    err = p.stderr.decode()
    assert "Traceback" not in err
    assert "commit_log_file_size_bytes" in err
