"""Messages (sdk/message.py): validation, the properties a send carries (tags, keys, UNIQ_KEY),
received messages and unique ids."""

from __future__ import annotations

import itertools
import os
import random
import re
import time
import zlib

import pytest

from data_plane.store.message import FLAG_COMPRESSED, StoredMessage, decode_properties
from sdk.errors import IllegalMessageError
from sdk.message import (
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    SendStatus,
    new_unique_id,
    new_unique_ids,
    py_unique_ids,
)


# --- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topic": "", "body": b"x"}, "topic is empty"),
        ({"topic": "a b", "body": b"x"}, "characters outside"),
        ({"topic": "t" * 128, "body": b"x"}, "more than 127"),
        ({"topic": "TBW102", "body": b"x"}, "default topic"),
        ({"topic": "T", "body": b""}, "body is empty"),
        ({"topic": "T", "body": "text"}, "body must be bytes"),
        ({"topic": "T", "body": b"x", "tags": "A || B"}, "'||'"),
        ({"topic": "T", "body": b"x", "tags": "  "}, "blank"),
        ({"topic": "T", "body": b"x", "tags": "t" * 256}, "more than 255"),
        ({"topic": "T", "body": b"x", "keys": "two words"}, "contains a space"),
        ({"topic": "T", "body": b"x", "keys": ["ok", ""]}, "non-empty string"),
        ({"topic": "T", "body": b"x", "keys": ""}, "non-empty string"),
        ({"topic": "T", "body": b"x", "keys": ("ok", 7)}, "non-empty string"),
        ({"topic": "T", "body": b"x", "delay_level": True}, "delay_level must be"),
        ({"topic": "T", "body": b"x", "delay_level": -1}, "delay_level must be"),
        ({"topic": "T", "body": b"x", "delay_level": 1.0}, "delay_level must be"),
        ({"topic": "T", "body": b"x", "deliver_at_ms": -5}, "deliver_at_ms must be"),
        ({"topic": "T", "body": b"x", "delay_level": 2, "deliver_at_ms": 5}, "not both"),
        ({"topic": "T", "body": b"x", "properties": {"TAGS": "x"}}, "reserved"),
        ({"topic": "T", "body": b"x", "properties": {"UNIQ_KEY": "x"}}, "reserved"),
        ({"topic": "T", "body": b"x", "properties": {"a": "b\x01c"}}, "separators"),
        ({"topic": "T", "body": b"x", "properties": {"a\x02": "b"}}, "separators"),
        ({"topic": "T", "body": b"x", "properties": {"": "b"}}, "non-empty"),
    ],
)
def test_a_bad_message_is_refused_where_it_is_built(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(IllegalMessageError, match=re.escape(error)):
        Message(**kwargs)  # type: ignore[arg-type]


def test_a_topic_or_tag_found_good_once_does_not_let_a_bad_one_through() -> None:
    """Good topics and tags are remembered (a set look-up instead of the checks); bad ones never are."""
    for _ in range(3):
        Message("Good", b"x", tags="fine")
        with pytest.raises(IllegalMessageError, match="characters outside"):
            Message("Go od", b"x", tags="fine")
        with pytest.raises(IllegalMessageError, match=re.escape("'||'")):
            Message("Good", b"x", tags="fine || other")
        with pytest.raises(IllegalMessageError, match="tags must be a string"):
            Message("Good", b"x", tags=["fine"])  # type: ignore[arg-type]
    for i in range(5000):  # more than it keeps: the memory is bounded, the answers unchanged
        Message(f"T{i}", b"x", tags=f"t{i}")
    with pytest.raises(IllegalMessageError, match="default topic"):
        Message("TBW102", b"x")


def test_a_plain_message_has_empty_keys_and_properties_of_its_own() -> None:
    shared: dict[str, str] = {}
    m = Message("T", b"x", keys=[], properties=shared)
    assert (m.keys, m.properties) == ((), {})
    assert m.properties is not shared
    plain = Message("T", bytearray(b"xy"))
    assert (plain.keys, plain.properties, plain.body) == ((), {}, b"xy")
    assert (plain.delay_level, plain.deliver_at_ms) == (0, None)
    assert type(plain.body) is bytes
    assert Message("T", b"x").properties is not plain.properties  # never one dict shared between messages


def test_a_body_is_kept_as_bytes_and_other_buffers_are_copied_into_bytes() -> None:
    body = b"payload"
    assert Message("T", body).body is body  # bytes are immutable: no copy
    source = bytearray(b"abc")
    made = [Message("T", given) for given in (source, memoryview(source), memoryview(b"xabcx")[1:4])]
    source[0] = ord("z")  # the messages' copies do not follow the caller's buffer
    for m in made:
        assert (type(m.body), m.body) == (bytes, b"abc")

    class Payload(bytes):
        pass

    sub = Message("T", Payload(b"sub"))
    assert (type(sub.body), sub.body) == (bytes, b"sub")
    for bad in ("text", 5, None):
        with pytest.raises(IllegalMessageError, match="body must be bytes"):
            Message("T", bad)  # type: ignore[arg-type]
    for empty in (b"", bytearray(), memoryview(b"")):
        with pytest.raises(IllegalMessageError, match="body is empty"):
            Message("T", empty)


def test_illegal_message_error_is_a_value_error_with_the_wire_code() -> None:
    with pytest.raises(ValueError, match="body is empty") as info:
        Message("T", b"")
    assert isinstance(info.value, IllegalMessageError)
    assert info.value.code == 13


# --- what a send carries ------------------------------------------------------------------------
def test_wire_properties_carry_tags_keys_wait_and_the_unique_id_next_to_user_properties() -> None:
    msg = Message("Orders", b"body", tags="paid", keys=["order-1", "user-7"], properties={"region": "eu"})
    props = msg.wire_properties("0123456789ABCDEF0123456789ABCDEF")
    assert props == {
        "region": "eu",
        "KEYS": "order-1 user-7",
        "TAGS": "paid",
        "WAIT": "true",
        "UNIQ_KEY": "0123456789ABCDEF0123456789ABCDEF",
    }
    assert decode_properties(msg.encoded_properties("U" * 32)) == {**props, "UNIQ_KEY": "U" * 32}


@pytest.mark.parametrize(
    "msg",
    [
        Message("T", b"x"),
        Message("T", b"x", tags="paid"),
        Message("T", b"x", tags="中文"),
        Message("T", b"x", tags="a", keys="k"),
        Message("T", b"x", properties={"p": "v"}),
        Message("T", b"x", tags="a", delay_level=3),
        Message("T", b"x", deliver_at_ms=1_700_000_000_000),
    ],
    ids=["plain", "tags", "unicode-tags", "keys", "user-property", "delay", "deliver-at"],
)
def test_encoded_properties_are_the_wire_properties_in_order(msg: Message) -> None:
    """Plain messages take a shortcut; every message's bytes are its wire properties, in order."""
    uid = new_unique_id()
    expected = "".join(f"{k}\x01{v}\x02" for k, v in msg.wire_properties(uid).items()).encode()
    assert msg.encoded_properties(uid) == expected


def test_one_key_may_be_given_as_a_string_and_no_tags_means_no_tags_property() -> None:
    msg = Message("T", b"x", keys="k1")
    assert msg.keys == ("k1",)
    props = msg.wire_properties("U" * 32)
    assert props["KEYS"] == "k1"
    assert "TAGS" not in props


def test_message_copies_a_mutable_body_and_properties() -> None:
    body = bytearray(b"abc")
    props = {"a": "1"}
    msg = Message("T", body, properties=props)
    body[0] = 0
    props["a"] = "2"
    assert msg.body == b"abc"
    assert msg.properties == {"a": "1"}


def test_a_unique_id_is_the_prefix_the_ms_since_the_month_began_and_a_counter() -> None:
    """RocketMQ's layout: 20 hex digits of process prefix, 8 of the milliseconds since the start
    of the month (local time, as RocketMQ's Calendar), 4 of a counter that counts on."""
    month_start = int(time.mktime((2026, 11, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    now = month_start + 26 * 86_400_000 + 36_000_123  # the 27th, ten hours in
    since = now - month_start
    ids = [new_unique_id(now), new_unique_id(now), new_unique_id(now + 1)]
    assert [i[20:28] for i in ids] == [f"{since:08X}", f"{since:08X}", f"{since + 1:08X}"]
    counters = [int(i[28:], 16) for i in ids]
    assert counters[1:] == [(counters[0] + 1) & 0xFFFF, (counters[0] + 2) & 0xFFFF]


def test_a_forked_child_makes_ids_of_its_own() -> None:
    """The prefix holds the pid and a random part: a child forked after the parent made ids
    must not make the parent's next ids (same counter, same millisecond) again."""
    now = 1_795_773_600_000
    parent = new_unique_id(now)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out at once
        os.write(write, new_unique_id(now).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32
    assert child[:20] != parent[:20]
    assert child != new_unique_id(now)


def test_unique_ids_are_32_upper_hex_digits_unique_and_share_a_process_prefix() -> None:
    ids = [new_unique_id() for _ in range(5000)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert len({i[:20] for i in ids}) == 1, "ip, pid and the process's random part"


def test_a_batch_of_unique_ids_is_made_as_single_ones_are() -> None:
    now_ms = 1_700_000_123_456
    one = new_unique_id(now_ms)
    batch = new_unique_ids(40, now_ms)
    after = new_unique_id(now_ms)
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in batch)
    assert {i[:28] for i in [one, *batch, after]} == {one[:28]}, "same process part and time"
    counters = [int(i[28:], 16) for i in [one, *batch, after]]
    assert counters == [(counters[0] + k) & 0xFFFF for k in range(42)], "one counter, in order"
    assert new_unique_ids(0) == []


def test_the_compiled_batch_ids_equal_their_python_twin(seed: int) -> None:
    """``_records.unique_ids`` and ``py_unique_ids`` over the same heads and counters (the
    counter wraps at 16 bits; each leaves the counter where the other does)."""
    from data_plane.store.compiled import records

    compiled = getattr(records(), "unique_ids", None)
    if compiled is None:
        pytest.skip("the compiled module is not built")
    rng = random.Random(seed)
    for _ in range(200):
        head = "".join(rng.choice("0123456789ABCDEF") for _ in range(rng.choice((0, 1, 28))))
        start, n = rng.choice((0, 65_530, 2**40 + 65_534, rng.randrange(2**20))), rng.randrange(0, 70)
        a, b = itertools.count(start), itertools.count(start)
        assert compiled(head, a, n) == py_unique_ids(head, b, n)
        assert next(a) == next(b) == start + n
    with pytest.raises(ValueError, match="ASCII"):
        compiled("é", itertools.count(), 1)
    with pytest.raises(ValueError, match="ran out"):
        compiled("A", iter([1, 2]), 3)
    with pytest.raises(TypeError):
        compiled("A", iter(["x"]), 1)


# --- received messages ------------------------------------------------------------------------------
def _stored(**changes: object) -> StoredMessage:
    fields: dict[str, object] = {
        "total_size": 200,
        "body_crc": 0,
        "queue_id": 3,
        "flag": 0,
        "queue_offset": 41,
        "commit_log_offset": 4096,
        "sys_flag": 0,
        "born_timestamp": 1_700_000_000_000,
        "born_host": ("10.0.0.1", 5555),
        "store_timestamp": 1_700_000_000_005,
        "store_host": ("10.0.0.2", 10911),
        "reconsume_times": 2,
        "prepared_transaction_offset": 0,
        "body": b"payload",
        "topic": "T",
        "properties": {"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "AB" * 16},
    }
    fields.update(changes)
    return StoredMessage(**fields)  # type: ignore[arg-type]


def test_message_ext_reads_tags_keys_and_prefers_the_producers_unique_id() -> None:
    m = MessageExt.from_stored(_stored(), "broker-a")
    assert (m.tags, m.keys, m.msg_id) == ("A", ("k1", "k2"), "AB" * 16)
    assert m.offset_msg_id == "0A00000200002A9F0000000000001000"
    assert m.message_queue == MessageQueue("T", "broker-a", 3)
    assert (m.queue_offset, m.reconsume_times, m.born_timestamp_ms, m.store_host) == (
        41,
        2,
        1_700_000_000_000,
        ("10.0.0.2", 10911),
    )


def test_message_ext_without_unique_id_uses_the_offset_message_id() -> None:
    m = MessageExt.from_stored(_stored(properties={}), "b")
    assert m.msg_id == m.offset_msg_id
    assert m.tags is None
    assert m.keys == ()


def test_a_body_compressed_by_a_java_producer_is_inflated() -> None:
    m = MessageExt.from_stored(_stored(body=zlib.compress(b"big " * 2000), sys_flag=FLAG_COMPRESSED), "b")
    assert m.body == b"big " * 2000


def test_message_queues_sort_by_topic_broker_and_queue_id_and_are_hashable() -> None:
    qs = [MessageQueue("b", "x", 0), MessageQueue("a", "y", 1), MessageQueue("a", "y", 0), MessageQueue("a", "x", 9)]
    assert sorted(qs) == [qs[3], qs[2], qs[1], qs[0]]
    assert len({MessageQueue("a", "x", 1), MessageQueue("a", "x", 1)}) == 1


def test_send_result_splits_the_ids_of_a_batch() -> None:
    r = SendResult(SendStatus.SEND_OK, "A,B,C", "X,Y,Z", MessageQueue("T", "b", 0), 7)
    assert r.msg_ids == ["A", "B", "C"]


def test_a_property_name_seen_before_does_not_let_a_bad_value_through() -> None:
    """Good property names are remembered (checked once); their values are still checked on
    every message."""
    Message("T", b"x", properties={"seen": "fine"})
    Message("T", b"x", properties={"seen": "fine again"})
    for bad in ("a\x01b", "a\x02b", 5, None):
        with pytest.raises(IllegalMessageError):
            Message("T", b"x", properties={"seen": bad})  # type: ignore[dict-item]
    with pytest.raises(IllegalMessageError, match="reserved"):
        Message("T", b"x", properties={"UNIQ_KEY": "x"})
