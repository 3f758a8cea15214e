"""data_plane/broker/trace.py over a real MessageStore in tmp_path: record() for other features'
events, the buffer's bound, the query's namespace rule; and the QUERY_MESSAGE_TRACE access entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from data_plane.auth.request_access import SUBSCRIBE, Need, access_of
from data_plane.broker.trace import MessageTrace, query
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store import MessageStore
from data_plane.store.config import StoreConfig
from data_plane.store.message import Message


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(
        StoreConfig(
            store_path=str(tmp_path),
            commit_log_file_size_bytes=16 << 20,
            reserve_ahead_bytes=0,
            index_hash_slots=4096,
            index_max_entries=16384,
        )
    )
    s.start()
    yield s
    s.shutdown()


def put(store: MessageStore, topic: str, uniq: str) -> str:
    result, _end = store.append([Message(topic, b"body", 0, 0, {"UNIQ_KEY": uniq})])
    assert result.append is not None
    return result.append.msg_id


def test_events_recorded_by_other_features_join_the_messages_timeline(store: MessageStore) -> None:
    msg_id = put(store, "acme%orders", "U1")
    trace = MessageTrace(store, clock_ms=lambda: 2**62)  # later than the store time
    trace.record(msg_id, "retried", group="acme%g", topic="acme%orders", retryTopic="%RETRY%acme%g", reconsumeTimes=1)
    trace.record("U1", "dead_lettered", group="acme%g", topic="%DLQ%acme%g")
    assert trace.flush() == 2
    events = query(store, "acme%orders", "U1")
    assert [e["event"] for e in events] == ["stored", "retried", "dead_lettered"]
    assert events[1]["msgId"] == msg_id
    assert events[1]["uniqKey"] == "U1"
    assert events[1]["reconsumeTimes"] == 1
    assert query(store, "acme%orders", msg_id) == events  # by the offset id too


def test_a_tenant_sees_only_events_of_its_namespace(store: MessageStore) -> None:
    put(store, "acme%orders", "SAME")
    put(store, "evil%orders", "SAME")  # a UNIQ_KEY is the client's: another tenant may reuse it
    trace = MessageTrace(store)
    trace.record("SAME", "retried", group="evil%g", topic="evil%orders")
    trace.record("SAME", "retried", group="acme%g", topic="%RETRY%acme%g")
    trace.flush()
    events = query(store, "acme%orders", "SAME")
    assert [(e["event"], e["topic"]) for e in events] == [("stored", "acme%orders"), ("retried", "%RETRY%acme%g")]


def test_a_full_buffer_drops_and_counts_instead_of_blocking(store: MessageStore) -> None:
    trace = MessageTrace(store, buffer_max=3, batch_max=2)
    for _ in range(5):
        trace.record("X" * 32, "retried")
    assert trace.dropped == 2
    assert trace.flush() == 3
    assert trace.written == 3


def test_tracing_a_message_needs_subscribe_on_its_topic() -> None:
    cmd = RemotingCommand(RequestCode.QUERY_MESSAGE_TRACE, ext_fields={"topic": "acme%orders", "msgId": "U1"})
    assert access_of(cmd).needs == (Need("topic", "acme%orders", SUBSCRIBE),)
    bare = RemotingCommand(RequestCode.QUERY_MESSAGE_TRACE, ext_fields={"msgId": "U1"})
    assert access_of(bare).needs == (Need("topic", "", SUBSCRIBE),)  # no topic: no tenant's, refused
