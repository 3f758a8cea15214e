"""The broker's plain single send answered straight from its frame (SendProcessor.send_frame,
Connection.frame_handler), against the command path, on a broker in this process over real
sockets: the same answers, the same stored records; every send it leaves goes the command path
on the same connection."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio

from data_plane.broker.broker import Broker
from data_plane.broker.config import BrokerConfig, BrokerRole
from data_plane.namesrv.server import NameServer
from data_plane.remoting.codes import FLAG_ONEWAY, PERM_READ, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, decode_frame
from data_plane.remoting.connection import Connection
from data_plane.remoting.send_frame import py_send_ok_frame
from data_plane.store import fastpath
from data_plane.store.message import StoredMessage
from sdk import Producer
from sdk.message import Message, new_unique_id
from sdk.protocol import SendHead

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not fastpath.COMPILED, reason="the frame path needs the compiled appender"),
]

SMALL_STORE: dict[str, Any] = {"commit_log_file_size_bytes": 16 << 20, "reserve_ahead_bytes": 0}


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "broker"), store=SMALL_STORE).validate()
    b = Broker(config)
    await b.start()
    for topic, queues in (("orders", 4), ("acme%orders", 1)):
        b.topics.create_or_update(topic, read_queue_nums=queues, write_queue_nums=queues)
    try:
        yield b
    finally:
        await b.shutdown()


class CommandPath:
    """Counts the requests the table's SEND_MESSAGE_V2 handler gets (instrumenting the broker's
    own handler, which still answers them)."""

    def __init__(self, broker: Broker) -> None:
        self.calls = 0
        handler = broker.processors.handlers[RequestCode.SEND_MESSAGE_V2]

        def counted(conn: Connection, cmd: RemotingCommand) -> Any:
            self.calls += 1
            return handler(conn, cmd)

        broker.processors.handlers[RequestCode.SEND_MESSAGE_V2] = counted


class Wire:
    """A raw client connection: writes frames, reads answer frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, broker: Broker, *, frame_path: bool) -> Wire:
        """A connection with the frame path, or one made while the broker had none."""
        processors = broker.processors
        kept = processors.frame_handler
        if not frame_path:
            processors.frame_handler = None
        before = set(broker.server.connections)
        host, _, port = broker.address.rpartition(":")
        wire = cls(*await asyncio.open_connection(host, int(port)))
        deadline = asyncio.get_running_loop().time() + 5
        while not broker.server.connections - before:
            assert asyncio.get_running_loop().time() < deadline, "the broker did not take the connection"
            await asyncio.sleep(0.005)
        processors.frame_handler = kept
        (conn,) = broker.server.connections - before
        assert (conn.frame_handler is not None) == frame_path
        return wire

    async def ask(self, frame: bytes) -> bytes:
        self.writer.write(frame)
        return await self.answer()

    async def answer(self) -> bytes:
        head = await asyncio.wait_for(self.reader.readexactly(4), 5)
        return head + await asyncio.wait_for(self.reader.readexactly(struct.unpack(">I", head)[0]), 5)

    def close(self) -> None:
        self.writer.close()


def sdk_frame(msg: Message, opaque: int, queue_id: int) -> bytes:
    """SEND_MESSAGE_V2 laid out as the SDK lays it out (SendHead), with its total length."""
    head = SendHead("grp").frame(msg, opaque, queue_id, new_unique_id(), 1_700_000_000_000 + opaque)
    assert head is not None
    return head + msg.body


def raw_frame(header: dict[str, Any], body: bytes) -> bytes:
    h = orjson.dumps(header)
    return struct.pack(">II", 4 + len(h) + len(body), len(h)) + h + body


async def warm_queues(wire: Wire, topic: str, queues: int) -> None:
    """A first message to each queue: the store takes a queue's first one the general way."""
    for q in range(queues):
        answer = decode_frame((await wire.ask(sdk_frame(Message(topic, b"warm"), 1000 + q, q)))[4:])
        assert answer.code == ResponseCode.SUCCESS


def stored(broker: Broker, answer: RemotingCommand) -> StoredMessage:
    ext = answer.ext_fields or {}
    msg = broker.store.view_message_by_id(ext["msgId"])
    assert msg is not None
    return msg


def same_record(a: StoredMessage, b: StoredMessage) -> None:
    """Two records of the same request: equal but for where and when they were stored (and the
    sending connection's port in the born host)."""
    for name in ("topic", "queue_id", "body", "flag", "sys_flag", "born_timestamp", "reconsume_times", "properties"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.born_host[0] == b.born_host[0]


@pytest.mark.asyncio
async def test_plain_sends_are_answered_from_their_frames_as_the_command_path_answers_them(
    broker: Broker, seed: int
) -> None:
    rng = random.Random(seed)
    table = CommandPath(broker)
    fast, slow = await Wire.open(broker, frame_path=True), await Wire.open(broker, frame_path=False)
    host_hex = broker.store.commit_log.store_host.hex().upper().encode()
    not_plain = 0  # sends the plain path leaves (properties not ASCII): the command path's
    try:
        await warm_queues(fast, "orders", 4)
        table.calls = 0
        for opaque in range(1, 61):
            body = rng.randbytes(rng.choice([1, 700, 1024, 20_000]))
            props = {"k": rng.choice(["v", "ü", "a b"])} if rng.random() < 0.5 else None
            msg = Message("orders", body, tags=rng.choice([None, "paid", "日本"]), properties=props)
            not_plain += not msg.user_properties_text().isascii() or not (msg.tags or "").isascii()
            frame = sdk_frame(msg, opaque, rng.randrange(4))
            got = [await wire.ask(frame) for wire in (fast, slow)]
            answers = [decode_frame(g[4:]) for g in got]
            for raw, a in zip(got, answers, strict=True):
                ext = a.ext_fields or {}
                assert (a.code, a.opaque, a.remark) == (ResponseCode.SUCCESS, opaque, None)
                offset = int(ext["msgId"][-16:], 16)
                # the very bytes the command path's answer is made of
                queue = (int(ext["queueId"]), int(ext["queueOffset"]))
                assert raw == py_send_ok_frame(a.version, opaque, host_hex, offset, *queue)
            a_fast, a_slow = answers
            ext_fast, ext_slow = a_fast.ext_fields or {}, a_slow.ext_fields or {}
            assert ext_fast["queueId"] == ext_slow["queueId"]
            assert int(ext_slow["queueOffset"]) == int(ext_fast["queueOffset"]) + 1
            same_record(stored(broker, a_fast), stored(broker, a_slow))
            assert stored(broker, a_fast).body == body
        assert 0 < not_plain < 60
        assert table.calls == 60 + not_plain  # the slow connection's sends, and those
        assert broker.stats["put_msgs"] == 4 + 120
    finally:
        fast.close()
        slow.close()


@pytest.mark.asyncio
async def test_sends_the_frame_path_leaves_take_the_command_path_on_the_same_connection(broker: Broker) -> None:
    table = CommandPath(broker)
    fast, slow = await Wire.open(broker, frame_path=True), await Wire.open(broker, frame_path=False)
    try:
        await warm_queues(fast, "orders", 4)
        table.calls = 0
        # a tenant's topic: its publish quota reads the command
        metered = decode_frame((await fast.ask(sdk_frame(Message("acme%orders", b"m"), 1, 0)))[4:])
        assert metered.code == ResponseCode.SUCCESS
        assert stored(broker, metered).body == b"m"
        assert table.calls == 1
        # a topic that takes no writes: the command path's refusal, the same on both connections
        broker.topics.create_or_update("read-only", read_queue_nums=1, write_queue_nums=1, perm=PERM_READ)
        frame = sdk_frame(Message("read-only", b"x"), 2, 0)
        refusals = [decode_frame((await w.ask(frame))[4:]) for w in (fast, slow)]
        assert refusals[0].code == ResponseCode.NO_PERMISSION
        assert (refusals[0].code, refusals[0].remark) == (refusals[1].code, refusals[1].remark)
        assert table.calls == 3
        # a delayed message (not plain: the schedule moves it), numbers as JSON numbers
        header = {
            "code": 310, "language": "CPP", "version": 399, "opaque": 4, "flag": 0,
            "extFields": {"a": "grp", "b": "orders", "e": "0", "i": "DELAY\x011\x02"},
        }  # fmt: skip
        delayed = decode_frame((await fast.ask(raw_frame(header, b"d")))[4:])
        assert (delayed.code, delayed.opaque) == (ResponseCode.SUCCESS, 4)
        assert stored(broker, delayed).topic == "SCHEDULE_TOPIC_XXXX"
        header["opaque"] = 5
        header["extFields"] = {"a": "grp", "b": "orders", "e": 1, "f": 0, "g": 1, "h": 0, "i": "", "j": 0}
        numbers = decode_frame((await fast.ask(raw_frame(header, b"n")))[4:])
        assert (numbers.code, numbers.opaque) == (ResponseCode.SUCCESS, 5)
        assert stored(broker, numbers).queue_id == 1
        assert table.calls == 5
        # a oneway send: stored, never answered (the next answer read is the next request's)
        before = broker.stats["put_msgs"]
        fast.writer.write(raw_frame({**header, "opaque": 6, "flag": FLAG_ONEWAY}, b"o"))
        after = decode_frame((await fast.ask(sdk_frame(Message("orders", b"p"), 7, 0)))[4:])
        assert after.opaque == 7
        assert broker.stats["put_msgs"] == before + 2
        assert table.calls == 6  # the oneway send; the plain one after it was the frame path's
    finally:
        fast.close()
        slow.close()


@pytest.mark.asyncio
async def test_the_sdks_sends_take_the_frame_path(tmp_path: Path) -> None:
    ns = NameServer()
    await ns.start()
    config = BrokerConfig(
        listen="127.0.0.1:0", namesrv_addrs=(ns.address,), store_dir=str(tmp_path / "b"), store=SMALL_STORE
    ).validate()
    b = Broker(config)
    await b.start()
    try:
        async with Producer("grp", namesrv_addrs=ns.address) as producer:
            await producer.create_topic("orders", queue_nums=2)
            for _ in range(2):  # the connection opened, and a first message in each queue
                await producer.send(Message("orders", b"first"))
            table = CommandPath(b)
            results = [await producer.send(Message("orders", f"m{i}".encode(), tags="t")) for i in range(20)]
        assert table.calls == 0
        for i, r in enumerate(results):
            got = b.store.view_message_by_id(r.offset_msg_id)
            assert got is not None
            assert (got.body, got.properties["TAGS"]) == (f"m{i}".encode(), "t")
    finally:
        await b.shutdown()
        await ns.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("setting", ["SYNC_FLUSH", "SYNC_MASTER"])
async def test_a_broker_whose_sends_all_wait_has_no_frame_handler(tmp_path: Path, setting: str) -> None:
    """Under SYNC_FLUSH, or as a SYNC_MASTER, every single send waits (for the flush, for the
    slave): the frame path would only read each frame to leave it."""
    config = BrokerConfig(
        listen="127.0.0.1:0",
        store_dir=str(tmp_path / "b"),
        store={**SMALL_STORE, "flush_disk_type": setting if setting == "SYNC_FLUSH" else "ASYNC_FLUSH"},
        broker_role=BrokerRole.SYNC_MASTER if setting == "SYNC_MASTER" else BrokerRole.ASYNC_MASTER,
    ).validate()
    b = Broker(config)
    await b.start()
    try:
        assert b.processors.frame_handler is None
        b.topics.create_or_update("orders", read_queue_nums=1, write_queue_nums=1)
        wire = await Wire.open(b, frame_path=False)
        try:  # (a SYNC_MASTER without a slave answers SLAVE_NOT_AVAILABLE, stored all the same)
            answer = decode_frame((await wire.ask(sdk_frame(Message("orders", b"x"), 1, 0)))[4:])
            assert answer.code in (ResponseCode.SUCCESS, ResponseCode.SLAVE_NOT_AVAILABLE)
            assert stored(b, answer).body == b"x"
        finally:
            wire.close()
    finally:
        await b.shutdown()
