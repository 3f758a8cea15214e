"""The remoting codec (data_plane/remoting/command.py), fed bytes only (no sockets): the JSON
and ROCKETMQ binary header forms, the byte layout of a frame, frames as Java clients write them,
the stream splitter (FrameDecoder) and what happens on garbage (always FrameError)."""

from __future__ import annotations

import random
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_plane.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode
from data_plane.remoting.command import (
    LANGUAGES,
    MAX_FRAME_BYTES,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Body,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    RemotingCommand,
    decode_frame,
    encode,
    encode_bytes,
    encode_header,
)

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


# --- helpers written from the protocol description, not from the module under test ------------
def frame_of(header: bytes, body: bytes = b"", stype: int = SERIALIZE_JSON) -> bytes:
    """A whole frame (with its 4-byte length prefix) as any client would write it."""
    return (
        struct.pack(">I", 4 + len(header) + len(body)) + struct.pack(">I", (stype << 24) | len(header)) + header + body
    )


def json_frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    return frame_of(orjson.dumps(header), body)


def binary_header(
    code: int,
    language: int,
    version: int,
    opaque: int,
    flag: int,
    remark: bytes | None,
    ext: list[tuple[bytes, bytes]] | None,
) -> bytes:
    """RocketMQSerializable.rocketMQProtocolEncode, by hand."""
    out = struct.pack(">h", code) + bytes([language]) + struct.pack(">h", version)
    out += struct.pack(">i", opaque) + struct.pack(">i", flag)
    out += struct.pack(">i", len(remark or b"")) + (remark or b"")
    ext_bytes = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in ext or [])
    out += struct.pack(">i", len(ext_bytes)) + ext_bytes
    return out


def strip_prefix(frame: bytes) -> bytes:
    (length,) = struct.unpack_from(">I", frame, 0)
    assert length == len(frame) - 4
    return frame[4:]


def roundtrip(cmd: RemotingCommand) -> RemotingCommand:
    return decode_frame(strip_prefix(encode_bytes(cmd)))


# --- JSON header --------------------------------------------------------------------------------
def test_a_json_command_survives_encode_and_decode_with_every_field() -> None:
    cmd = RemotingCommand(
        RequestCode.SEND_MESSAGE_V2,
        opaque=77,
        flag=FLAG_ONEWAY,
        remark="hello ☃",
        ext_fields={"a": "topic-1", "b": "3", "empty": ""},
        body=b"\x00payload\xff",
        language="JAVA",
        version=401,
    )
    back = roundtrip(cmd)
    assert back.code == RequestCode.SEND_MESSAGE_V2
    assert back.opaque == 77
    assert back.flag == FLAG_ONEWAY
    assert back.is_oneway
    assert not back.is_response
    assert back.remark == "hello ☃"
    assert back.ext_fields == {"a": "topic-1", "b": "3", "empty": ""}
    assert back.body == b"\x00payload\xff"
    assert back.language == "JAVA"
    assert back.version == 401
    assert back.serialize_type == SERIALIZE_JSON


def test_a_json_command_without_remark_ext_fields_or_body_decodes_them_as_absent() -> None:
    back = roundtrip(RemotingCommand(RequestCode.HEART_BEAT, opaque=5))
    assert back.remark is None
    assert back.ext_fields is None
    assert back.body is None
    assert back.body_bytes() == b""


def test_the_json_header_carries_the_java_field_names() -> None:
    cmd = RemotingCommand(105, opaque=9, flag=FLAG_RESPONSE, remark="r", ext_fields={"topic": "T"}, version=399)
    h = orjson.loads(encode_header(cmd))
    assert h == {
        "code": 105,
        "language": "PYTHON",
        "version": 399,
        "opaque": 9,
        "flag": FLAG_RESPONSE,
        "serializeTypeCurrentRPC": "JSON",
        "remark": "r",
        "extFields": {"topic": "T"},
    }


def test_a_json_frame_is_laid_out_byte_for_byte_as_the_protocol_says() -> None:
    body = b"0123456789"
    cmd = RemotingCommand(RequestCode.PULL_MESSAGE, opaque=1, ext_fields={"k": "v"}, body=body)
    frame = encode_bytes(cmd)
    header = encode_header(cmd)
    total, mark = struct.unpack_from(">II", frame, 0)
    assert total == len(frame) - 4 == 4 + len(header) + len(body)
    assert mark >> 24 == SERIALIZE_JSON
    assert mark & 0xFFFFFF == len(header)
    assert frame[8 : 8 + len(header)] == header
    assert orjson.loads(frame[8 : 8 + len(header)])["code"] == RequestCode.PULL_MESSAGE
    assert frame[8 + len(header) :] == body


def test_a_rocketmq_binary_frame_has_type_one_in_the_high_byte_of_the_header_length() -> None:
    cmd = RemotingCommand(10, opaque=3, ext_fields={"k": "v"}, body=b"xy", serialize_type=SERIALIZE_ROCKETMQ)
    frame = encode_bytes(cmd)
    total, mark = struct.unpack_from(">II", frame, 0)
    hlen = mark & 0xFFFFFF
    assert frame[4] == SERIALIZE_ROCKETMQ
    assert mark >> 24 == SERIALIZE_ROCKETMQ
    assert total == 4 + hlen + 2
    assert frame[8 + hlen :] == b"xy"
    assert frame[8 : 8 + hlen] == binary_header(10, LANGUAGES.index("PYTHON"), 399, 3, 0, None, [(b"k", b"v")])


def test_a_body_given_as_memoryviews_encodes_to_the_same_bytes_as_the_joined_body() -> None:
    data = bytes(range(256)) * 8
    pieces = [memoryview(data)[0:100], memoryview(data)[100:101], memoryview(data)[101:101], memoryview(data)[101:]]
    joined = RemotingCommand(11, opaque=4, flag=FLAG_RESPONSE, ext_fields={"a": "b"}, body=data)
    split = RemotingCommand(11, opaque=4, flag=FLAG_RESPONSE, ext_fields={"a": "b"}, body=pieces)
    assert b"".join(encode(split)) == encode_bytes(joined)
    assert encode_bytes(split) == encode_bytes(joined)
    assert split.body_bytes() == data
    # The body's buffers are handed over, not copied into the header's piece.
    assert any(p is pieces[0] for p in encode(split))


def test_a_bytearray_or_memoryview_body_encodes_like_bytes() -> None:
    ref = encode_bytes(RemotingCommand(11, body=b"abc"))
    assert encode_bytes(RemotingCommand(11, body=bytearray(b"abc"))) == ref
    assert encode_bytes(RemotingCommand(11, body=memoryview(b"abc"))) == ref


# --- frames as a Java (or C++, Go...) client writes them ---------------------------------------
def test_a_hand_written_java_frame_decodes_with_numbers_and_booleans_in_ext_fields_as_strings() -> None:
    header = (
        b'{"code":310,"extFields":{"a":"please_rename_unique_group_name","b":"TopicTest","c":"TBW102",'
        b'"d":4,"e":2,"f":0,"g":1700000000123,"h":0,"k":false,"l":3.0,"m":true,"n":null,"o":[1,"x"]},'
        b'"flag":0,"language":"JAVA","opaque":42,"serializeTypeCurrentRPC":"JSON","version":399}'
    )
    cmd = decode_frame(strip_prefix(frame_of(header, b"Hello RocketMQ")))
    assert cmd.code == RequestCode.SEND_MESSAGE_V2
    assert cmd.opaque == 42
    assert cmd.language == "JAVA"
    assert cmd.version == 399
    assert cmd.remark is None  # fastjson leaves out a null remark
    assert cmd.body == b"Hello RocketMQ"
    assert cmd.ext_fields is not None
    assert cmd.ext_fields["a"] == "please_rename_unique_group_name"
    assert cmd.ext_fields["d"] == "4"
    assert cmd.ext_fields["g"] == "1700000000123"
    assert cmd.ext_fields["k"] == "false"
    assert cmd.ext_fields["m"] == "true"
    assert cmd.ext_fields["l"] == "3.0"
    assert cmd.ext_fields["n"] == ""
    assert orjson.loads(cmd.ext_fields["o"]) == [1, "x"]
    assert all(isinstance(v, str) for v in cmd.ext_fields.values())


def test_unknown_extra_header_fields_are_ignored() -> None:
    cmd = decode_frame(
        strip_prefix(
            json_frame(
                {
                    "code": 34,
                    "opaque": 1,
                    "flag": 0,
                    "language": "GO",
                    "version": 317,
                    "serializeTypeCurrentRPC": "JSON",
                    "someFutureField": {"nested": [1, 2]},
                    "another": None,
                }
            )
        )
    )
    assert (cmd.code, cmd.opaque, cmd.language, cmd.version) == (34, 1, "GO", 317)


@pytest.mark.parametrize("language", ["CPP", "JAVA", "PYTHON", "GO"])
def test_the_language_of_a_json_header_is_kept(language: str) -> None:
    cmd = decode_frame(strip_prefix(json_frame({"code": 105, "language": language, "opaque": 8, "flag": 0})))
    assert cmd.language == language


def test_a_minimal_json_header_with_only_a_code_gets_defaults() -> None:
    cmd = decode_frame(strip_prefix(json_frame({"code": 105})))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.remark, cmd.ext_fields) == (105, 0, 0, 0, None, None)


def test_a_json_response_frame_is_recognized_by_its_flag_and_keeps_its_remark() -> None:
    cmd = decode_frame(
        strip_prefix(json_frame({"code": 17, "flag": 1, "opaque": 9, "remark": "topic not exist", "language": "JAVA"}))
    )
    assert cmd.is_response
    assert cmd.code == ResponseCode.TOPIC_NOT_EXIST
    assert cmd.remark == "topic not exist"


def test_a_negative_opaque_as_java_writes_after_its_counter_wraps_is_accepted() -> None:
    cmd = decode_frame(strip_prefix(json_frame({"code": 105, "opaque": INT32_MIN})))
    assert cmd.opaque == INT32_MIN
    assert roundtrip(cmd.response(0)).opaque == INT32_MIN


# --- ROCKETMQ binary header ---------------------------------------------------------------------
def test_a_hand_built_rocketmq_binary_header_decodes() -> None:
    header = binary_header(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        LANGUAGES.index("CPP"),
        399,
        123456,
        0,
        "remarké".encode(),
        [(b"topic", b"TopicTest"), (b"n", b"12"), (b"empty", b"")],
    )
    cmd = decode_frame(strip_prefix(frame_of(header, b"body!", SERIALIZE_ROCKETMQ)))
    assert cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
    assert cmd.language == "CPP"
    assert cmd.version == 399
    assert cmd.opaque == 123456
    assert cmd.flag == 0
    assert cmd.remark == "remarké"
    assert cmd.ext_fields == {"topic": "TopicTest", "n": "12", "empty": ""}
    assert cmd.body == b"body!"
    assert cmd.serialize_type == SERIALIZE_ROCKETMQ


def test_a_binary_header_without_remark_or_ext_fields_decodes_them_as_absent() -> None:
    header = binary_header(34, 0, 399, -5, FLAG_ONEWAY, None, None)
    cmd = decode_frame(strip_prefix(frame_of(header, stype=SERIALIZE_ROCKETMQ)))
    assert (cmd.remark, cmd.ext_fields, cmd.body, cmd.language, cmd.opaque) == (None, None, None, "JAVA", -5)
    assert cmd.is_oneway


def test_an_unknown_language_ordinal_in_a_binary_header_becomes_other() -> None:
    cmd = decode_frame(strip_prefix(frame_of(binary_header(34, 200, 1, 1, 0, None, None), stype=SERIALIZE_ROCKETMQ)))
    assert cmd.language == "OTHER"


def test_a_binary_command_survives_encode_and_decode() -> None:
    cmd = RemotingCommand(
        RequestCode.SEND_BATCH_MESSAGE,
        opaque=INT32_MAX,
        flag=FLAG_ONEWAY,
        remark="ok",
        ext_fields={"topic": "T", "queueId": "3", "ünï": "cödé"},
        body=b"\x01\x02",
        language="GO",
        version=-1,
        serialize_type=SERIALIZE_ROCKETMQ,
    )
    back = roundtrip(cmd)
    assert (back.code, back.opaque, back.flag, back.remark, back.language, back.version) == (
        RequestCode.SEND_BATCH_MESSAGE,
        INT32_MAX,
        FLAG_ONEWAY,
        "ok",
        "GO",
        -1,
    )
    assert back.ext_fields == {"topic": "T", "queueId": "3", "ünï": "cödé"}
    assert back.body == b"\x01\x02"
    assert back.serialize_type == SERIALIZE_ROCKETMQ
    # Decoding and re-encoding reproduces the same bytes.
    assert encode_bytes(back) == encode_bytes(cmd)


def test_a_hand_built_binary_frame_re_encodes_to_the_same_bytes() -> None:
    header = binary_header(105, 3, 399, 77, 0, b"rm", [(b"topic", b"T"), (b"x", b"1")])
    frame = frame_of(header, b"b", SERIALIZE_ROCKETMQ)
    assert encode_bytes(decode_frame(strip_prefix(frame))) == frame


@pytest.mark.parametrize("stype", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ])
def test_a_response_keeps_its_requests_serialization_opaque_and_version(stype: int) -> None:
    request = RemotingCommand(105, opaque=31, version=373, serialize_type=stype, ext_fields={"topic": "T"})
    request = roundtrip(request)
    response = request.response(ResponseCode.TOPIC_NOT_EXIST, "no route", body=b"{}")
    assert response.serialize_type == stype
    assert response.is_response
    assert (response.opaque, response.version) == (31, 373)
    frame = encode_bytes(response)
    assert frame[4] == stype
    back = roundtrip(response)
    assert back.serialize_type == stype
    assert (back.code, back.remark, back.opaque, back.is_response, back.body) == (17, "no route", 31, True, b"{}")


# --- FrameDecoder -------------------------------------------------------------------------------
def sample_frames() -> list[bytes]:
    return [
        encode_bytes(RemotingCommand(105, opaque=1, ext_fields={"topic": "T"})),
        encode_bytes(RemotingCommand(10, opaque=2, body=b"x" * 300, serialize_type=SERIALIZE_ROCKETMQ)),
        encode_bytes(RemotingCommand(0, opaque=3, flag=FLAG_RESPONSE, remark="ok")),
        frame_of(b"{}"),  # a frame the splitter passes on even though decode would refuse it
    ]


def test_several_frames_in_one_chunk_come_out_in_order() -> None:
    frames = sample_frames()
    decoder = FrameDecoder()
    out = decoder.feed(b"".join(frames))
    assert [bytes(f) for f in out] == [strip_prefix(f) for f in frames]
    assert decoder.buffered == 0


def test_a_stream_split_at_every_byte_boundary_yields_the_same_frames() -> None:
    frames = sample_frames()
    stream = b"".join(frames)
    expected = [strip_prefix(f) for f in frames]
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        out = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [bytes(f) for f in out] == expected, cut
        assert decoder.buffered == 0


def test_a_stream_fed_one_byte_at_a_time_yields_each_frame_when_its_last_byte_arrives() -> None:
    frames = sample_frames()
    stream = b"".join(frames)
    ends = set()
    pos = 0
    for f in frames:
        pos += len(f)
        ends.add(pos)
    decoder = FrameDecoder()
    got: list[bytes] = []
    for i in range(len(stream)):
        out = decoder.feed(memoryview(stream)[i : i + 1])
        assert bool(out) == (i + 1 in ends), i
        got.extend(bytes(f) for f in out)
    assert got == [strip_prefix(f) for f in frames]
    assert decoder.buffered == 0


def test_a_stream_in_random_chunks_yields_the_same_frames(seed: int) -> None:
    rng = random.Random(seed)
    frames = [
        encode_bytes(RemotingCommand(rng.randrange(400), opaque=i, body=rng.randbytes(rng.randrange(0, 2000))))
        for i in range(200)
    ]
    stream = b"".join(frames)
    decoder = FrameDecoder()
    got: list[bytes] = []
    pos = 0
    while pos < len(stream):
        n = rng.choice([1, 2, 3, 4, 5, 7, 8, 64, 1000, 5000])
        chunk = stream[pos : pos + n]
        got.extend(bytes(f) for f in decoder.feed(bytearray(chunk) if rng.random() < 0.5 else chunk))
        pos += n
    assert got == [strip_prefix(f) for f in frames]
    assert decoder.buffered == 0
    assert [decode_frame(f).opaque for f in got] == list(range(200))


def test_only_the_frame_spread_over_two_reads_is_copied() -> None:
    """The frame the second read completes is joined alone, exactly its size; the frames after
    it in that read are views of the read itself (a 256 KiB read is not copied whole)."""
    a, b, c = (encode_bytes(RemotingCommand(1, opaque=i, body=bytes([i]) * 5000)) for i in range(3))
    first, second = a[:3000], a[3000:] + b + c
    decoder = FrameDecoder()
    assert decoder.feed(first) == []
    got = decoder.feed(second)
    assert [bytes(f) for f in got] == [strip_prefix(a), strip_prefix(b), strip_prefix(c)]
    joined, *rest = got
    assert isinstance(joined, memoryview)
    assert len(joined.obj) == len(a)  # type: ignore[arg-type]
    assert all(isinstance(f, memoryview) and f.obj is second for f in rest)


def test_frames_handed_out_keep_their_bytes_while_the_stream_goes_on(seed: int) -> None:
    """A frame is a view, not a copy: what it shows must not change as later bytes arrive,
    whether it was joined from several reads or cut from one."""
    rng = random.Random(seed)
    frames = [
        encode_bytes(RemotingCommand(1, opaque=i, body=rng.randbytes(rng.randrange(0, 3000)))) for i in range(100)
    ]
    stream = b"".join(frames)
    decoder = FrameDecoder()
    kept: list[Body] = []
    pos = 0
    while pos < len(stream):
        n = rng.choice([3, 100, 1000, 2500, 7000])
        kept.extend(decoder.feed(bytearray(stream[pos : pos + n])))
        pos += n
    assert [bytes(f) for f in kept] == [strip_prefix(f) for f in frames]


@given(st.lists(st.binary(max_size=50), max_size=8), st.data())
def test_any_split_of_any_frames_yields_the_same_frames(bodies: list[bytes], data: st.DataObject) -> None:
    frames = [frame_of(b'{"code":1}', b) for b in bodies]
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    got: list[bytes] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got.extend(bytes(f) for f in decoder.feed(stream[prev:cut]))
        prev = cut
    assert got == [strip_prefix(f) for f in frames]
    assert decoder.buffered == 0


def test_a_frame_over_the_limit_raises_frame_too_large_before_its_bytes_are_buffered() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">I", 101) + b"\x00" * 50)
    assert info.value.size == 101
    assert info.value.limit == 100
    assert isinstance(info.value, FrameError)
    assert decoder.buffered == 0


def test_a_frame_exactly_at_the_limit_is_accepted() -> None:
    header = b'{"code":1}'
    frame = frame_of(header, b"z" * (100 - 4 - len(header)))
    assert struct.unpack_from(">I", frame)[0] == 100
    out = FrameDecoder(max_frame_bytes=100).feed(frame)
    assert len(out) == 1
    assert decode_frame(out[0]).body == b"z" * (100 - 4 - len(header))


def test_the_length_prefix_alone_of_an_oversized_frame_is_refused() -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1)[:2])
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1)[2:])


def test_an_oversized_frame_after_good_frames_in_the_same_stream_is_refused() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    good = frame_of(b'{"code":1}')
    assert len(decoder.feed(good)) == 1
    assert decoder.feed(good[:3]) == []
    with pytest.raises(FrameTooLarge):
        decoder.feed(good[3:] + struct.pack(">I", 4096))


@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_a_frame_length_under_four_raises_frame_error(length: int) -> None:
    with pytest.raises(FrameError, match="shorter"):
        FrameDecoder().feed(struct.pack(">I", length) + b"\x00" * 8)


def test_a_partial_length_prefix_waits_for_more_bytes() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.buffered == 2
    assert decoder.feed(b"") == []
    assert decoder.buffered == 2


# --- garbage -----------------------------------------------------------------------------------
def json_hdr(raw: bytes) -> bytes:
    """A frame (without length prefix) whose JSON header is ``raw``."""
    return struct.pack(">I", len(raw)) + raw


def bin_hdr(raw: bytes) -> bytes:
    """A frame (without length prefix) whose ROCKETMQ binary header is ``raw``."""
    return struct.pack(">I", (SERIALIZE_ROCKETMQ << 24) | len(raw)) + raw


_FIXED = b"\x00" * 13  # code, language, version, opaque, flag
_NO_REMARK = _FIXED + struct.pack(">I", 0)


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"", "shorter than its header-length"),
        (b"\x00\x00\x00", "shorter than its header-length"),
        (struct.pack(">I", 5) + b"{}", "does not fit"),
        (struct.pack(">I", 0xFFFFFF) + b"{}", "does not fit"),
        (json_hdr(b""), "not JSON"),
        (json_hdr(b"{x}"), "not JSON"),
        (json_hdr(b"\xff\xfe{}"), "not JSON"),
        (json_hdr(b"[1,2,3]"), "not a JSON object"),
        (json_hdr(b'"ab"'), "not a JSON object"),
        (json_hdr(b"{}"), "missing or not a number"),
        (json_hdr(b'{"code":"x"}'), "missing or not a number"),
        (json_hdr(b'{"code":null}'), "missing or not a number"),
        (json_hdr(b'{"code":[]}'), "missing or not a number"),
        (json_hdr(b'{"code":1,"opaque":"abc"}'), "missing or not a number"),
        (json_hdr(b'{"code":1,"flag":{}}'), "missing or not a number"),
        (json_hdr(b'{"code":1,"extFields":[1]}'), "extFields is not an object"),
        (json_hdr(b'{"code":1,"extFields":"a"}'), "extFields is not an object"),
        (struct.pack(">I", (2 << 24) | 2) + b"{}", "unknown header serialization type 2"),
        (struct.pack(">I", (0xFF << 24) | 2) + b"{}", "unknown header serialization type 255"),
        (bin_hdr(b""), "truncated"),
        (bin_hdr(b"\x00" * 5), "truncated"),
        (bin_hdr(_FIXED), "truncated"),  # no remark length
        (bin_hdr(_FIXED + struct.pack(">I", 100)), "remark runs past"),
        (bin_hdr(_NO_REMARK), "truncated"),  # no extFields length
        (bin_hdr(_NO_REMARK + struct.pack(">I", 100)), "extFields run past"),
        (bin_hdr(_NO_REMARK + struct.pack(">I", 1) + b"\x00"), "truncated"),  # cut in a key length
        (bin_hdr(_NO_REMARK + struct.pack(">I", 5) + b"\x00\x01k\x00\x00"), "truncated"),  # cut in a value length
        (bin_hdr(_NO_REMARK + struct.pack(">I", 9) + b"\x00\x01k\x00\x00\x00\x09ab"), "value runs past"),
        (bin_hdr(_NO_REMARK + struct.pack(">I", 9) + b"\x00\x09k\x00\x00\x00\x00ab"), "truncated|runs past"),
        (bin_hdr(_FIXED + struct.pack(">I", 2) + b"\xff\xfe" + struct.pack(">I", 0)), "not UTF-8"),
        (bin_hdr(_NO_REMARK + struct.pack(">I", 8) + b"\x00\x01\xff\x00\x00\x00\x01a"), "not UTF-8"),
    ],
)
def test_decoding_garbage_raises_frame_error_saying_what_is_wrong(frame: bytes, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode_frame(frame)


@pytest.mark.parametrize(
    "header",
    [
        b'{"code":1e300}',
        b'{"code":1,"opaque":1e300}',
        b'{"code":1,"opaque":18446744073709551616}',
        b'{"code":1,"opaque":9223372036854775808}',
        b'{"code":1,"opaque":2147483648}',
        b'{"code":1,"version":1e30}',
        b'{"code":1,"flag":-1e20}',
        b'{"code":4294967296}',
    ],
)
def test_header_numbers_outside_javas_int_range_are_refused_as_frame_errors(header: bytes) -> None:
    # Java's RemotingCommand fields are ints; a number that is not one cannot be answered either
    # (its opaque would not encode), so it is a malformed frame.
    with pytest.raises(FrameError):
        decode_frame(strip_prefix(frame_of(header)))


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_random_bytes_make_the_decoder_raise_only_frame_error(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=256)
    try:
        for frame in decoder.feed(data):
            decode_frame(frame)
    except FrameError:
        pass


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_NUMBER = st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-9, 9)
_FIELD = _NUMBER | _JSON
_HEADERS = st.fixed_dictionaries(
    {"code": _FIELD},
    optional={
        "opaque": _FIELD,
        "flag": _FIELD,
        "version": _FIELD,
        "language": _FIELD,
        "remark": _FIELD,
        "extFields": st.dictionaries(st.text(max_size=5), _FIELD, max_size=4) | _JSON,
        "x": _JSON,
    },
)


@settings(max_examples=1000)
@given(_HEADERS, st.binary(max_size=20))
def test_any_json_header_decodes_to_a_command_that_can_be_answered_or_raises_frame_error(
    header: dict[str, Any], body: bytes
) -> None:
    try:
        cmd = decode_frame(strip_prefix(frame_of(orjson.dumps(header), body)))
    except FrameError:
        return
    assert isinstance(cmd.code, int)
    assert cmd.ext_fields is None or all(isinstance(v, str) for v in cmd.ext_fields.values())
    assert cmd.remark is None or isinstance(cmd.remark, str)
    answer = roundtrip(cmd.response(ResponseCode.SYSTEM_ERROR, "x"))
    assert answer.opaque == cmd.opaque


@st.composite
def binary_headers(draw: st.DrawFn) -> bytes:
    """A ROCKETMQ binary header whose lengths are sometimes right and sometimes lies."""
    fixed = draw(st.binary(min_size=13, max_size=13))
    remark = draw(st.binary(max_size=10))
    remark_len = draw(st.just(len(remark)) | st.integers(0, 20) | st.integers(0, 2**32 - 1))
    entries = draw(
        st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6), st.integers(-2, 2), st.integers(-2, 2)))
    )
    ext = b"".join(
        struct.pack(">H", max(0, len(k) + dk)) + k + struct.pack(">I", max(0, len(v) + dv)) + v
        for k, v, dk, dv in entries
    )
    ext_len = draw(st.just(len(ext)) | st.integers(0, 40) | st.integers(0, 2**32 - 1))
    tail = draw(st.binary(max_size=4))
    return fixed + struct.pack(">I", remark_len) + remark + struct.pack(">I", ext_len) + ext + tail


@settings(max_examples=1000)
@given(binary_headers(), st.binary(max_size=20))
def test_any_binary_header_decodes_to_a_command_that_can_be_answered_or_raises_frame_error(
    header: bytes, body: bytes
) -> None:
    try:
        cmd = decode_frame(strip_prefix(frame_of(header, body, stype=SERIALIZE_ROCKETMQ)))
    except FrameError:
        return
    assert cmd.ext_fields is None or all(isinstance(v, str) for v in cmd.ext_fields.values())
    answer = roundtrip(cmd.response(ResponseCode.SUCCESS, "x", ext_fields={"a": "b"}))
    assert (answer.opaque, answer.version, answer.serialize_type) == (cmd.opaque, cmd.version, SERIALIZE_ROCKETMQ)
