"""The consumer's pull-body decoder, both of it: the compiled ``_records.decode_records`` and its
pure-Python twin ``sdk.protocol.py_decode_messages``. Every test runs against each; records are
laid out by hand here (``RECORD_HEADER``) so that odd and broken ones can be made too."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator

import pytest

from data_plane.store.message import (
    FLAG_COMPRESSED,
    MESSAGE_MAGIC_CODE,
    RECORD_HEADER,
    body_crc,
    encode_properties,
    pack_host,
    unpack_host,
)
from sdk import errors, protocol, record_codec
from sdk.message import MessageExt

BORN = pack_host("10.9.9.9", 4321)
STORE = pack_host("10.1.2.3", 10911)


@pytest.fixture(params=["compiled", "python"])
def decoder(request: pytest.FixtureRequest) -> Iterator[str]:
    was = protocol.use_compiled_decoder(request.param == "compiled")
    if request.param == "compiled" and not protocol.compiled_decoder_on():
        protocol.use_compiled_decoder(was)
        pytest.skip("the compiled module is not built")
    yield request.param
    protocol.use_compiled_decoder(was)


def record(
    *,
    body: bytes = b"hello",
    topic: bytes = b"Orders",
    props: bytes = b"TAGS\x01A\x02",
    queue_id: int = 2,
    queue_offset: int = 0,
    physical: int = 0,
    sys_flag: int = 0,
    flag: int = 0,
    reconsume: int = 0,
    crc: int | None = None,
    magic: int = MESSAGE_MAGIC_CODE,
    props_len: int | None = None,
    born: bytes = BORN,
    store: bytes = STORE,
    born_ts: int = 1_700_000_000_000,
    store_ts: int = 1_700_000_000_123,
) -> bytes:
    total = RECORD_HEADER.size + len(body) + 1 + len(topic) + 2 + len(props)
    head = RECORD_HEADER.pack(
        total, magic, body_crc(body) if crc is None else crc, queue_id, flag, queue_offset, physical, sys_flag,
        born_ts, born, store_ts, store, reconsume, 0, len(body),
    )  # fmt: skip
    plen = len(props) if props_len is None else props_len
    return head + body + bytes([len(topic)]) + topic + plen.to_bytes(2, "big", signed=True) + props


def as_dict(m: MessageExt) -> dict[str, object]:
    return {name: getattr(m, name) for name in MessageExt.FIELDS}


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 7, 8])
def test_both_decoders_give_the_same_messages(seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    parts, offset = [], 0
    hosts = [BORN, STORE, pack_host("10.9.9.9", 4322), pack_host("192.168.0.1", 10911)]
    for i in range(rng.randrange(1, 40)):
        # Names and values the compiled decoder keeps made (TAGS, true, ...), near misses of
        # them, and arbitrary text.
        common = ["TAGS", "KEYS", "WAIT", "UNIQ_KEY", "true", "false", "TAG", "TAGSS", "tru", "trueX", "DELAY"]
        props = {
            (rng.choice(common) if rng.random() < 0.5 else f"k{j}"): (
                rng.choice(common) if rng.random() < 0.4 else "".join(rng.choice("aé中z9 ") for _ in range(20))
            )
            for j in range(rng.randrange(0, 6))
        }
        if rng.random() < 0.5:  # tags in runs (the compiled decoder reuses the last one made)
            props["TAGS"] = rng.choice(["A", "B", "tag-é", "A "])
        rec = record(
            # sizes and timestamps in runs too, and changes between them (reused ints)
            body=rng.randbytes(rng.choice([1, 100, 100, 100, rng.randrange(1, 3000)])),
            born_ts=rng.choice([1_700_000_000_000, 1_700_000_000_000, 1_700_000_000_001, 2**63 - 1]),
            store_ts=rng.choice([1_700_000_000_123, 1_700_000_000_123, 0, 1_700_000_000_124]),
            # runs of one topic and host, as pulls have them, and changes between them
            topic=rng.choice([b"Orders", b"%RETRY%G", b"T" * 127, b"Orderz"]) if rng.random() < 0.3 else b"Orders",
            born=rng.choice(hosts) if rng.random() < 0.3 else BORN,
            store=rng.choice(hosts) if rng.random() < 0.3 else STORE,
            props=encode_properties(props) if props else b"",
            queue_id=rng.randrange(0, 1 << 31),
            queue_offset=i,
            physical=offset,
            flag=rng.randrange(-(1 << 31), 1 << 31),
            reconsume=rng.randrange(0, 17),
        )
        parts.append(rec)
        offset += len(rec)
    body = b"".join(parts)
    was = protocol.use_compiled_decoder(True)
    try:
        if not protocol.compiled_decoder_on():
            pytest.skip("the compiled module is not built")
        compiled = protocol.decode_messages(body, "broker-a")
    finally:
        protocol.use_compiled_decoder(was)
    python = protocol.py_decode_messages(body, "broker-a")
    assert len(compiled) == len(python) == len(parts)
    for c, p in zip(compiled, python, strict=True):
        assert as_dict(c) == as_dict(p)
    assert [m.commit_log_offset for m in compiled] == [sum(map(len, parts[:i])) for i in range(len(parts))]


def test_fields_of_one_record(decoder: str) -> None:
    (m,) = protocol.decode_messages(
        record(body=b"payload", props=b"TAGS\x01A\x02UNIQ_KEY\x01ABC\x02", queue_offset=7, physical=4096, reconsume=3),
        "broker-a",
    )
    assert (m.topic, m.body, m.queue_id, m.queue_offset, m.broker_name) == ("Orders", b"payload", 2, 7, "broker-a")
    assert m.properties == {"TAGS": "A", "UNIQ_KEY": "ABC"}
    assert (m.tags, m.msg_id) == ("A", "ABC")
    assert m.offset_msg_id == "0A01020300002A9F0000000000001000"
    assert (m.commit_log_offset, m.reconsume_times) == (4096, 3)
    assert (m.born_host, m.store_host) == (("10.9.9.9", 4321), ("10.1.2.3", 10911))
    assert (m.born_timestamp_ms, m.store_timestamp_ms) == (1_700_000_000_000, 1_700_000_000_123)
    assert m.store_size == len(record(body=b"payload", props=b"TAGS\x01A\x02UNIQ_KEY\x01ABC\x02"))
    assert m.extra == {}
    m.extra["seen"] = True  # each message has its own
    (again,) = protocol.decode_messages(record(), "b")
    assert again.extra == {}


def test_properties_are_read_as_rocketmq_writes_them(decoder: str) -> None:
    # an item without a name/value separator is dropped; an empty name is kept; empty items skipped
    (m,) = protocol.decode_messages(record(props=b"a\x01b\x02\x02no-separator\x02\x01x\x02k\x01\x02"), "b")
    assert m.properties == {"a": "b", "": "x", "k": ""}
    (m,) = protocol.decode_messages(record(props=b""), "b")
    assert m.properties == {}


def test_what_is_made_on_first_use_is_made_once_and_kept(decoder: str) -> None:
    """properties, offset_msg_id and extra may be made when first read (the compiled decoder
    leaves them): a change to them sticks, an assignment replaces them, and each message has its
    own."""
    one, two = protocol.decode_messages(
        record(props=b"TAGS\x01A\x02", physical=0) + record(props=b"TAGS\x01A\x02", physical=4096), "b"
    )
    assert one.properties is one.properties
    one.properties["seen"] = "yes"
    assert one.properties == {"TAGS": "A", "seen": "yes"}
    assert two.properties == {"TAGS": "A"}
    two.properties = {"TAGS": "B"}
    assert (two.tags, one.tags) == ("B", "A")
    assert one.offset_msg_id == "0A01020300002A9F0000000000000000"
    assert two.offset_msg_id == "0A01020300002A9F0000000000001000"
    two.offset_msg_id = "ELSEWHERE"
    assert (two.offset_msg_id, two.msg_id) == ("ELSEWHERE", "ELSEWHERE")
    one.extra["n"] = 1
    assert (one.extra, two.extra) == ({"n": 1}, {})
    assert one.extra is one.extra


def test_a_compressed_body_is_inflated(decoder: str) -> None:
    plain = b"x" * 10_000
    packed = zlib.compress(plain)
    first = record(body=b"not compressed")
    second = record(body=packed, sys_flag=0x1, physical=len(first))
    got = protocol.decode_messages(first + second, "b")
    assert [m.body for m in got] == [b"not compressed", plain]
    broken = record(body=b"not zlib at all", sys_flag=0x1)
    with pytest.raises(errors.BrokerError, match=rf"record at byte {len(first)} does not decompress"):
        protocol.decode_messages(first + broken, "b")


def test_the_crc_check_can_be_skipped(decoder: str) -> None:
    bad = record(body=b"abc", crc=12345)
    with pytest.raises(errors.BrokerError, match="record at byte 0 fails its body CRC"):
        protocol.decode_messages(bad, "b")
    (m,) = protocol.decode_messages(bad, "b", check_crc=False)
    assert m.body == b"abc"


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        (record()[:50], "is cut short"),
        (record(magic=0x12345678), r"is not sound \(magic or sizes\)"),
        (record()[:-1], r"is not sound \(magic or sizes\)"),
        (record(topic=b"\xff\xfe"), "has a topic that is not UTF-8"),
        (record(props=b"TAGS\x01\xff\x02"), "has bad properties"),
        (record(props=b"TAGS\x01A"), r"is not sound \(properties\)"),
        (record(props=b"TAGS\x01A\x02", props_len=-1), r"is not sound \(properties\)"),
        (record(props=b"TAGS\x01A\x02", props_len=3), r"is not sound \(properties\)"),
    ],
)
def test_an_unsound_record_is_a_broker_error_naming_its_position(decoder: str, broken: bytes, why: str) -> None:
    good = record()
    with pytest.raises(errors.BrokerError, match=rf"pull body: record at byte {len(good)} {why}"):
        protocol.decode_messages(good + broken, "b")


def test_an_empty_body_is_no_messages(decoder: str) -> None:
    assert protocol.decode_messages(b"", "b") == []


def test_each_codec_answers_its_records_and_the_compressed_count_by_name() -> None:
    """``RecordCodec.decode_records`` through each implementation: a named answer (messages,
    compressed), the compressed body left for the caller to inflate."""
    body = record(body=b"plain") + record(body=zlib.compress(b"inflated"), sys_flag=FLAG_COMPRESSED)
    codecs = [record_codec.PYTHON] + ([c] if (c := record_codec.compiled_codec()) is not None else [])
    for codec in codecs:
        got = codec.decode_records(body, MessageExt, "broker-a", True, {}, {}, unpack_host)
        assert type(got).__name__ == "Decoded"
        assert got.compressed == 1  # type: ignore[attr-defined]
        assert [m.body for m in got.messages] == [b"plain", zlib.compress(b"inflated")]  # type: ignore[attr-defined]
        assert tuple(got) == (got.messages, 1)  # type: ignore[attr-defined]
