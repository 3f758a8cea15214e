"""Bad input gets a clear status, nothing written (MessageStore.append and the puts)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageResult, PutMessageStatus
from data_plane.store.message import decode_record
from tests.conftest import ManualClock, small_config

MAX_MESSAGE = 16 * 1024  # small_config's max_message_size_bytes
MAX_PROPS = 1024  # set below for the properties cases


def _record_size(topic: str, body_len: int, properties: dict[str, str]) -> int:
    props = "".join(f"{k}\x01{v}\x02" for k, v in properties.items()).encode()
    return 88 + body_len + 1 + len(topic.encode()) + 2 + len(props)


def _props_of_size(n: int) -> dict[str, str]:
    """Properties whose encoding (``name \\x01 value \\x02``) takes exactly ``n`` bytes."""
    return {"P": "v" * (n - 3)}


def _assert_sentence(reason: str) -> None:
    assert reason.strip(), "a refusal must say why"
    assert re.search(r"[A-Za-z]+ [A-Za-z]+", reason), f"not a sentence: {reason!r}"


def _assert_good_put_still_works(store: MessageStore, expected_queue_offset: int) -> None:
    result = store.put_messages_blocking([Message("T", b"good after bad", properties={"KEYS": "good"})])
    assert result.status is PutMessageStatus.PUT_OK, result
    assert result.append is not None
    assert result.append.queue_offset == expected_queue_offset
    r = store.get_message("T", 0, expected_queue_offset, 1)
    assert r.status is GetMessageStatus.FOUND
    assert decode_record(r.messages[0]).body == b"good after bad"
    assert [m.body for m in store.query_message("T", "good")] == [b"good after bad"]


BAD_MESSAGES: list[tuple[str, Callable[[], Message], PutMessageStatus]] = [
    (
        "record one byte over max_message_size_bytes",
        lambda: Message("T", b"b" * (MAX_MESSAGE - _record_size("T", 0, {}) + 1)),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    ("body far over the max size", lambda: Message("T", b"b" * (4 * MAX_MESSAGE)), PutMessageStatus.MESSAGE_ILLEGAL),
    ("empty topic", lambda: Message("", b"body"), PutMessageStatus.MESSAGE_ILLEGAL),
    ("128-character topic", lambda: Message("t" * 128, b"body"), PutMessageStatus.MESSAGE_ILLEGAL),
    ("topic with a space", lambda: Message("my topic", b"body"), PutMessageStatus.MESSAGE_ILLEGAL),
    ("topic with a slash", lambda: Message("a/b", b"body"), PutMessageStatus.MESSAGE_ILLEGAL),
    ("topic with dot-dot-slash", lambda: Message("../x", b"body"), PutMessageStatus.MESSAGE_ILLEGAL),
    (
        "properties one byte over the max",
        lambda: Message("T", b"body", properties=_props_of_size(MAX_PROPS + 1)),
        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
    ),
    (
        "property value holding \\x01",
        lambda: Message("T", b"body", properties={"KEYS": "a\x01b"}),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    (
        "property value holding \\x02",
        lambda: Message("T", b"body", properties={"TAGS": "a\x02b"}),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    (
        "property name holding \\x01",
        lambda: Message("T", b"body", properties={"na\x01me": "v"}),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    ("empty body", lambda: Message("T", b""), PutMessageStatus.MESSAGE_ILLEGAL),
    ("queue id -1", lambda: Message("T", b"body", queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL),
    ("very negative queue id", lambda: Message("T", b"body", queue_id=-(2**31)), PutMessageStatus.MESSAGE_ILLEGAL),
]

BAD_CASES = [pytest.param(make, status, id=name) for name, make, status in BAD_MESSAGES]


@pytest.mark.parametrize(("make_message", "status"), BAD_CASES)
def test_a_bad_message_gets_a_clear_status_and_nothing_is_written(
    make_store: Callable[..., MessageStore],
    write_path: str,
    make_message: Callable[[], Message],
    status: PutMessageStatus,
) -> None:
    store = make_store(max_properties_size_bytes=MAX_PROPS)
    store.put_messages_blocking([Message("T", b"before", properties={"KEYS": "before"})])
    max_phy = store.max_phy_offset()
    bad = make_message()
    result = store.put_messages_blocking([bad])
    assert result.status is status
    assert result.append is None
    _assert_sentence(result.reason)
    assert store.max_phy_offset() == max_phy
    assert store.max_offset_in_queue("T", 0) == 1
    assert store.max_offset_in_queue(bad.topic, bad.queue_id) == (1 if (bad.topic, bad.queue_id) == ("T", 0) else 0)
    assert store.topics() == {"T"}
    _assert_good_put_still_works(store, expected_queue_offset=1)


@pytest.mark.asyncio
@pytest.mark.parametrize(("make_message", "status"), BAD_CASES)
async def test_an_awaited_put_of_a_bad_message_gets_the_same_status_and_writes_nothing(
    make_store: Callable[..., MessageStore], make_message: Callable[[], Message], status: PutMessageStatus
) -> None:
    store = make_store(max_properties_size_bytes=MAX_PROPS)
    max_phy = store.max_phy_offset()
    result = await store.put_message(make_message())
    assert result.status is status
    _assert_sentence(result.reason)
    assert store.max_phy_offset() == max_phy
    assert store.max_offset_in_queue("T", 0) == 0
    _assert_good_put_still_works(store, expected_queue_offset=0)


@pytest.mark.parametrize(
    ("odd", "reason"),
    [
        (lambda: Message("T", b"bad", properties={"KEYS": "x\x02y"}), ""),
        (lambda: Message("U", b"other topic"), "the messages of a batch must share topic and queue"),
        (lambda: Message("T", b"other queue", queue_id=1), "the messages of a batch must share topic and queue"),
    ],
    ids=["bad properties", "other topic", "other queue"],
)
def test_a_batch_with_one_bad_message_writes_none_of_it(
    make_store: Callable[..., MessageStore], write_path: str, odd: Callable[[], Message], reason: str
) -> None:
    store = make_store()
    store.put_messages_blocking([Message("T", b"before")])
    max_phy = store.max_phy_offset()
    batch = [Message("T", b"fine %d" % i) for i in range(5)]
    batch.insert(3, odd())
    result = store.put_messages_blocking(batch)
    assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
    _assert_sentence(result.reason)
    assert reason in result.reason
    assert store.max_phy_offset() == max_phy
    assert store.max_offset_in_queue("T", 0) == 1
    _assert_good_put_still_works(store, expected_queue_offset=1)


def test_limits_are_inclusive_a_message_exactly_at_each_limit_is_stored(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store(max_properties_size_bytes=MAX_PROPS)
    at_limits = [
        Message("T", b"b" * (MAX_MESSAGE - _record_size("T", 0, {}))),  # record of exactly the max size
        Message("t" * 127, b"body"),  # the longest topic
        Message("T", b"body", properties=_props_of_size(MAX_PROPS)),  # properties of exactly the max
        Message("Ok_%|-9", b"body"),  # every allowed kind of character
    ]
    for msg in at_limits:
        result = store.put_messages_blocking([msg])
        assert result.status is PutMessageStatus.PUT_OK, result
        assert result.append is not None
        stored = store.look_message_by_offset(result.append.wrote_offset)
        assert stored is not None
        assert (stored.topic, stored.body, stored.properties) == (msg.topic, msg.body, msg.properties)
    record = store.look_message_by_offset(0)
    assert record is not None
    assert record.total_size == MAX_MESSAGE


def test_a_store_that_was_never_started_answers_service_not_available(tmp_path: Path, clock: ManualClock) -> None:
    store = MessageStore(small_config(str(tmp_path / "store")), clock_ms=clock)
    results: list[PutMessageResult] = [
        store.put_messages_blocking([Message("T", b"body")]),
        store.append([Message("T", b"body")])[0],
    ]
    for result in results:
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        _assert_sentence(result.reason)
    assert store.max_phy_offset() == 0


@pytest.mark.asyncio
async def test_a_store_that_was_shut_down_answers_service_not_available(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    assert (await store.put_message(Message("T", b"before"))).status is PutMessageStatus.PUT_OK
    store.shutdown()
    results = [
        await store.put_message(Message("T", b"after")),
        await store.put_messages([Message("T", b"after")]),
        store.put_messages_blocking([Message("T", b"after")]),
    ]
    for result in results:
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        _assert_sentence(result.reason)
    store.start()
    assert store.max_offset_in_queue("T", 0) == 1  # nothing was written while it was down
    result = await store.put_message(Message("T", b"after restart"))
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    assert result.append.queue_offset == 1
