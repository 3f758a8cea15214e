"""The CommitLog record, message ids, properties, tag hash codes and topic names (message.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from data_plane.store import Message, MessageStore, PutMessageStatus
from data_plane.store.message import (
    OFF_BODY_CRC,
    OFF_MAGIC,
    RECORD_HEADER,
    TRANSACTION_COMMIT_TYPE,
    RecordError,
    StoredMessage,
    decode_message_id,
    decode_properties,
    decode_record,
    encode_message_id,
    encode_properties,
    pack_host,
    tags_hash_code,
    validate_topic,
)
from tests.conftest import ManualClock

BORN_HOST = ("10.1.2.3", 54321)
STORE_HOST = ("192.168.7.9", 10912)


def _stored(make_store: Callable[..., MessageStore], msg: Message) -> tuple[MessageStore, bytes, int]:
    """Put ``msg`` in a fresh store and return the store, its record's bytes and its offset."""
    store = make_store(store_host=STORE_HOST[0], store_port=STORE_HOST[1])
    result, _ = store.append([msg])
    assert result.status is PutMessageStatus.PUT_OK, result
    assert result.append is not None
    offset = result.append.wrote_offset
    record = store.commit_log.read_record(offset)
    assert record is not None
    return store, bytes(record), offset


def _sample_message(queue_id: int = 2) -> Message:
    return Message(
        topic="Topic_%|-1",
        body=bytes(range(256)) * 3 + b"tail",
        queue_id=queue_id,
        flag=-7,
        properties={"TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "AC1100FF0000", "custom": "v\u00e9"},
        sys_flag=TRANSACTION_COMMIT_TYPE,
        born_timestamp=1_699_999_999_123,
        born_host=pack_host(*BORN_HOST),
        reconsume_times=3,
        prepared_transaction_offset=987_654_321,
    )


# --- the record ------------------------------------------------------------------------------
def test_record_header_is_88_bytes() -> None:
    assert RECORD_HEADER.size == 88


def test_decode_record_gives_back_every_field_of_a_record_written_by_the_store(
    make_store: Callable[..., MessageStore], clock: ManualClock, write_path: str
) -> None:
    msg = _sample_message()
    store, raw, offset = _stored(make_store, msg)
    # Put a second one in the same queue so the queue offset is not trivially 0.
    second = _sample_message()
    second.body = b"second body"
    result, _ = store.append([second])
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    raw2 = store.commit_log.read_record(result.append.wrote_offset)
    assert raw2 is not None

    got = decode_record(raw)
    assert isinstance(got, StoredMessage)
    assert got.total_size == len(raw)
    assert got.topic == msg.topic
    assert got.queue_id == 2
    assert got.queue_offset == 0
    assert got.commit_log_offset == offset
    assert got.born_host == BORN_HOST
    assert got.store_host == STORE_HOST
    assert got.born_timestamp == msg.born_timestamp
    assert got.store_timestamp == clock.now_ms
    assert got.flag == -7
    assert got.sys_flag == TRANSACTION_COMMIT_TYPE
    assert got.reconsume_times == 3
    assert got.prepared_transaction_offset == 987_654_321
    assert got.body == msg.body
    assert got.properties == msg.properties
    assert got.tags == "tagA"
    assert got.keys == ["k1", "k2"]
    assert decode_message_id(got.msg_id) == (STORE_HOST[0], STORE_HOST[1], offset)

    got2 = decode_record(raw2)
    assert got2.queue_offset == 1
    assert got2.commit_log_offset == offset + len(raw)
    assert got2.body == b"second body"


def test_decode_record_reads_a_record_at_a_position_inside_a_larger_buffer(
    make_store: Callable[..., MessageStore],
) -> None:
    _, raw, offset = _stored(make_store, _sample_message())
    buf = b"\xee" * 13 + raw + b"\xff" * 5
    assert decode_record(buf[: 13 + len(raw)], 13).commit_log_offset == offset
    with pytest.raises(RecordError):
        decode_record(buf, 13 + len(raw))  # 5 bytes: not even a header


def test_decode_record_raises_record_error_for_a_bad_magic_code(make_store: Callable[..., MessageStore]) -> None:
    _, raw, _ = _stored(make_store, _sample_message())
    bad = bytearray(raw)
    bad[OFF_MAGIC] ^= 0x01
    with pytest.raises(RecordError, match="magic"):
        decode_record(bytes(bad))


@pytest.mark.parametrize("cut", [1, 10, 50])
def test_decode_record_raises_record_error_for_a_truncated_record(
    make_store: Callable[..., MessageStore], cut: int
) -> None:
    _, raw, _ = _stored(make_store, _sample_message())
    with pytest.raises(RecordError):
        decode_record(raw[: len(raw) - cut])
    with pytest.raises(RecordError):
        decode_record(raw[:40])  # not even a whole header


def test_decode_record_raises_record_error_when_a_body_byte_is_flipped(
    make_store: Callable[..., MessageStore],
) -> None:
    _, raw, _ = _stored(make_store, _sample_message())
    bad = bytearray(raw)
    bad[RECORD_HEADER.size + 100] ^= 0x40
    with pytest.raises(RecordError, match="CRC"):
        decode_record(bytes(bad))
    # The same bytes pass when the CRC check is turned off, and show the flipped body.
    assert decode_record(bytes(bad), check_crc=False).body[100] == raw[RECORD_HEADER.size + 100] ^ 0x40


def test_decode_record_raises_record_error_when_the_stored_crc_is_wrong(
    make_store: Callable[..., MessageStore],
) -> None:
    _, raw, _ = _stored(make_store, _sample_message())
    bad = bytearray(raw)
    bad[OFF_BODY_CRC + 3] ^= 0x01
    with pytest.raises(RecordError, match="CRC"):
        decode_record(bytes(bad))


@pytest.mark.parametrize("delta", [-1, 1, -200])
def test_decode_record_raises_record_error_when_the_properties_length_does_not_end_the_record(
    make_store: Callable[..., MessageStore], delta: int
) -> None:
    msg = _sample_message()
    _, raw, _ = _stored(make_store, msg)
    props_len = len(encode_properties(msg.properties))
    at = len(raw) - props_len - 2
    assert struct.unpack_from(">h", raw, at)[0] == props_len
    bad = bytearray(raw)
    struct.pack_into(">h", bad, at, props_len + delta)
    with pytest.raises(RecordError, match="properties length"):
        decode_record(bytes(bad))


def test_decode_record_raises_record_error_for_a_topic_that_is_not_utf8(
    make_store: Callable[..., MessageStore],
) -> None:
    msg = _sample_message()
    _, raw, _ = _stored(make_store, msg)
    topic_at = RECORD_HEADER.size + len(msg.body) + 1
    assert raw[topic_at : topic_at + len(msg.topic)] == msg.topic.encode()
    bad = bytearray(raw)
    bad[topic_at] = 0xFF  # the topic is not covered by the body CRC
    with pytest.raises(RecordError):
        decode_record(bytes(bad))


def test_decode_record_raises_record_error_for_properties_that_are_not_utf8(
    make_store: Callable[..., MessageStore],
) -> None:
    _, raw, _ = _stored(make_store, _sample_message())
    bad = bytearray(raw)
    bad[-3] = 0xFF  # inside the last property's value
    with pytest.raises(RecordError):
        decode_record(bytes(bad))


def test_decode_record_raises_record_error_when_the_total_size_runs_past_the_buffer(
    make_store: Callable[..., MessageStore],
) -> None:
    _, raw, _ = _stored(make_store, _sample_message())
    bad = bytearray(raw)
    struct.pack_into(">i", bad, 0, len(raw) + 1)
    with pytest.raises(RecordError):
        decode_record(bytes(bad))


# --- message ids -----------------------------------------------------------------------------
def test_encode_message_id_is_32_upper_case_hex_digits_of_ip_port_and_offset() -> None:
    msg_id = encode_message_id(pack_host("192.168.0.1", 10911), 0x1234ABCD)
    assert msg_id == "C0A80001" + "00002A9F" + "000000001234ABCD"
    assert len(msg_id) == 32
    assert msg_id == msg_id.upper()


@given(
    ip=st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t))),
    port=st.integers(0, 65535),
    offset=st.integers(0, 2**63 - 1),
)
def test_encode_then_decode_message_id_gives_back_ip_port_and_offset(ip: str, port: int, offset: int) -> None:
    msg_id = encode_message_id(pack_host(ip, port), offset)
    assert len(msg_id) == 32
    assert all(c in "0123456789ABCDEF" for c in msg_id)
    assert decode_message_id(msg_id) == (ip, port, offset)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "C0A8000100002A9F000000001234ABC",  # 31
        "C0A8000100002A9F000000001234ABCD0",  # 33
    ],
)
def test_decode_message_id_raises_value_error_for_a_wrong_length(bad: str) -> None:
    with pytest.raises(ValueError, match="32"):
        decode_message_id(bad)


@pytest.mark.parametrize(
    "bad",
    [
        "G" * 32,
        "C0A8000100002A9F000000001234ABCZ",
        "C0A8000100002A9F00000000-234ABCD",
        "C0A80001 00002A9F 000000001234AB",  # 32 characters, 30 of them hex digits
        "C0A8000100002A9F00000000001234\u0661\u0662",  # non-ASCII digits
    ],
)
def test_decode_message_id_raises_value_error_for_non_hex_characters(bad: str) -> None:
    assert len(bad) == 32
    with pytest.raises(ValueError, match="hex"):
        decode_message_id(bad)


# --- properties ------------------------------------------------------------------------------
def test_encode_properties_uses_rocketmq_name_value_separators() -> None:
    assert encode_properties({"TAGS": "a", "KEYS": "k1 k2"}) == b"TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert encode_properties({}) == b""
    assert decode_properties(b"TAGS\x01a\x02KEYS\x01k1 k2\x02") == {"TAGS": "a", "KEYS": "k1 k2"}
    assert decode_properties(b"") == {}


_prop_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=30)


@given(st.dictionaries(_prop_text.filter(bool), _prop_text, max_size=12))
def test_encode_then_decode_properties_gives_back_the_same_dict(props: dict[str, str]) -> None:
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert decode_properties(memoryview(raw)) == props
    assert decode_properties(raw.decode()) == props


# --- tag hash codes --------------------------------------------------------------------------
def _java_hash_by_hand(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, as a signed int."""
    units: list[int] = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    h = 0
    for u in units:
        h = (h * 31 + u) % 2**32
    return h - 2**32 if h >= 2**31 else h


def test_tags_hash_code_equals_java_string_hash_code_for_known_values() -> None:
    assert tags_hash_code("hello") == 99162322
    assert tags_hash_code("") == 0
    assert tags_hash_code("a") == 97
    # Overflows to a negative Java int.
    assert tags_hash_code("TagA||TagB||TagC||TagD") == _java_hash_by_hand("TagA||TagB||TagC||TagD")
    assert tags_hash_code("polygenelubricants") == -2147483648  # Java's famous MIN_VALUE hash


def test_tags_hash_code_hashes_a_non_bmp_character_as_its_utf16_surrogate_pair() -> None:
    # U+1F600 is the pair D83D DE00 in UTF-16: Java hashes the two code units.
    assert tags_hash_code("\U0001f600") == 31 * 0xD83D + 0xDE00 == 1772899
    assert tags_hash_code("x\U0001f600y") == ((ord("x") * 31 + 0xD83D) * 31 + 0xDE00) * 31 + ord("y")
    assert tags_hash_code("tag-\U00010348-\U0010ffff") == _java_hash_by_hand("tag-\U00010348-\U0010ffff")


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_tags_hash_code_matches_java_string_hash_code_for_any_text(s: str) -> None:
    assert tags_hash_code(s) == _java_hash_by_hand(s)
    assert tags_hash_code(s) == tags_hash_code(s)  # the cached answer is the same


# --- topic names -----------------------------------------------------------------------------
def test_validate_topic_accepts_rocketmq_topic_characters_up_to_127() -> None:
    assert validate_topic("TopicTest") is None
    assert validate_topic("%RETRY%group_1|a-b") is None
    assert validate_topic("t" * 127) is None


def test_validate_topic_rejects_an_empty_topic() -> None:
    assert validate_topic("") is not None


def test_validate_topic_rejects_a_128_character_topic() -> None:
    problem = validate_topic("t" * 128)
    assert problem is not None
    assert "128" in problem


@pytest.mark.parametrize("topic", ["a b", "a.b", "a/b", "topic#1", "t\u00e9", "a\nb", "a\x00", "a:b", "tab\t"])
def test_validate_topic_rejects_characters_outside_the_allowed_set(topic: str) -> None:
    problem = validate_topic(topic)
    assert problem is not None
    assert "characters" in problem


def test_validate_topic_rejects_a_trailing_newline() -> None:
    # `$` in a regex matches before a final newline: the check must still refuse it.
    assert validate_topic("topic\n") is not None
