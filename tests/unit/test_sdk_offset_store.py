"""Offset stores (sdk/offset_store.py) and where a new queue starts (sdk/consumer.py), with a
scripted stand-in for the broker: no sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_plane.remoting.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk.consumer import ConsumeFrom, ConsumerBase
from sdk.errors import OrbitError
from sdk.message import MessageQueue
from sdk.offset_store import LocalOffsetStore, RemoteOffsetStore

MQ = MessageQueue("T", "broker-a", 1)
MQ2 = MessageQueue("T", "broker-a", 2)


class FakeBroker:
    """Answers offset requests from a table; records what it is asked."""

    client_id = "127.0.0.1@1#test"

    def __init__(self, committed: dict[MessageQueue, int] | None = None) -> None:
        self.committed = dict(committed or {})
        self.requests: list[RemotingCommand] = []
        self.min_offset, self.max_offset, self.search_offset = 3, 40, 17

    async def broker_addr(self, mq: MessageQueue, broker_id: int = 0, *, master_only: bool = False) -> str:
        return "10.0.0.1:10911"

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        self.requests.append(cmd)
        ext = cmd.ext_fields or {}
        mq = MessageQueue(ext["topic"], "broker-a", int(ext["queueId"]))
        if cmd.code == RequestCode.QUERY_CONSUMER_OFFSET:
            if mq not in self.committed:
                return RemotingCommand(ResponseCode.QUERY_NOT_FOUND, flag=FLAG_RESPONSE, remark="not found")
            return self._ok(self.committed[mq])
        if cmd.code == RequestCode.UPDATE_CONSUMER_OFFSET:
            self.committed[mq] = int(ext["commitOffset"])
            return self._ok(None)
        value = {
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
        }[RequestCode(cmd.code)]
        return self._ok(value)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        await self.invoke(addr, cmd)

    @staticmethod
    def _ok(offset: int | None) -> RemotingCommand:
        ext = {"offset": str(offset)} if offset is not None else None
        return RemotingCommand(ResponseCode.SUCCESS, flag=FLAG_RESPONSE, ext_fields=ext)


def _consumer(broker: FakeBroker, consume_from: str, **changes: int) -> ConsumerBase:
    c = ConsumerBase("G", namesrv_addrs="127.0.0.1:9876", consume_from=consume_from, **changes)  # type: ignore[arg-type]
    c._instance = broker  # type: ignore[assignment]
    c._offsets = RemoteOffsetStore(broker, "G")  # type: ignore[arg-type]
    return c


# --- where a queue starts ---------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("consume_from", "expected", "asked"),
    [
        ("LAST_OFFSET", 40, RequestCode.GET_MAX_OFFSET),
        ("FIRST_OFFSET", 3, RequestCode.GET_MIN_OFFSET),
        ("TIMESTAMP", 17, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP),
    ],
)
async def test_a_queue_without_committed_offset_starts_where_consume_from_says(
    consume_from: str, expected: int, asked: RequestCode
) -> None:
    broker = FakeBroker()
    c = _consumer(broker, consume_from, consume_timestamp_ms=1_700_000_000_000)
    assert await c.compute_pull_from(MQ) == expected
    assert [r.code for r in broker.requests] == [RequestCode.QUERY_CONSUMER_OFFSET, asked]
    if asked == RequestCode.SEARCH_OFFSET_BY_TIMESTAMP:
        assert (broker.requests[1].ext_fields or {})["timestamp"] == "1700000000000"


@pytest.mark.asyncio
@pytest.mark.parametrize("consume_from", ["LAST_OFFSET", "FIRST_OFFSET", "TIMESTAMP"])
async def test_a_committed_offset_wins_over_consume_from(consume_from: str) -> None:
    broker = FakeBroker({MQ: 25})
    c = _consumer(broker, consume_from)
    assert await c.compute_pull_from(MQ) == 25
    assert len(broker.requests) == 1
    assert c.consume_from is ConsumeFrom[consume_from]


def test_consume_from_accepts_rocketmq_names_and_refuses_others() -> None:
    c = ConsumerBase("G", namesrv_addrs="h:1", consume_from="CONSUME_FROM_FIRST_OFFSET")
    assert c.consume_from is ConsumeFrom.FIRST_OFFSET
    with pytest.raises(OrbitError, match="consume_from"):
        ConsumerBase("G", namesrv_addrs="h:1", consume_from="SOMEWHERE")


# --- the remote store -------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_remote_store_only_moves_forward_unless_told_and_persists_what_it_holds() -> None:
    broker = FakeBroker()
    store = RemoteOffsetStore(broker, "G")  # type: ignore[arg-type]
    store.update(MQ, 10)
    store.update(MQ, 7)
    assert store.read_memory(MQ) == 10
    store.update(MQ, 7, increase_only=False)
    assert store.read_memory(MQ) == 7
    store.update(MQ2, 3)
    await store.persist([MQ], sync=True)
    assert broker.committed == {MQ: 7}
    await store.persist()
    assert broker.committed == {MQ: 7, MQ2: 3}
    assert await store.read_store(MessageQueue("T", "broker-a", 9)) is None


# --- the local store (broadcasting) -------------------------------------------------------------------
@pytest.mark.asyncio
async def test_local_store_survives_a_restart_through_its_file(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path, "inst", "G")
    await store.load()
    assert store.read_memory(MQ) is None
    store.update(MQ, 12)
    store.update(MQ2, 4)
    await store.persist()
    assert store.path == tmp_path / "inst" / "G.json"
    assert not list(store.path.parent.glob("*.tmp")), "the temporary file was renamed into place"
    again = LocalOffsetStore(tmp_path, "inst", "G")
    await again.load()
    assert again.offsets() == {MQ: 12, MQ2: 4}
    data = json.loads(store.path.read_text())
    assert data["offsets"][0] == {"topic": "T", "brokerName": "broker-a", "queueId": 1, "offset": 12}


@pytest.mark.asyncio
async def test_local_store_keeps_groups_and_instances_apart_and_refuses_a_corrupt_file(tmp_path: Path) -> None:
    a = LocalOffsetStore(tmp_path, "one", "G")
    b = LocalOffsetStore(tmp_path, "two", "G")
    a.update(MQ, 1)
    await a.persist()
    await b.load()
    assert b.offsets() == {}
    a.path.write_text("{not json")
    with pytest.raises(OrbitError, match="not readable"):
        await LocalOffsetStore(tmp_path, "one", "G").load()
    odd = LocalOffsetStore(tmp_path, "a/b", "../G")
    assert odd.path.parent.parent == tmp_path, "names cannot escape the directory"
