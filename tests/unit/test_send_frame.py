"""SEND_MESSAGE_V2's fields read off a frame (remoting/send_frame.py): the compiled reader and its
Python twin agree, take only the common shape (anything else is left to the command path), and
the SUCCESS frame laid out for a stored message is the twin's bytes."""

from __future__ import annotations

import random
import string
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_plane.remoting.codes import FLAG_RESPONSE
from data_plane.remoting.command import (
    BODY_VIEW_BYTES,
    SERIALIZE_ROCKETMQ,
    RemotingCommand,
    encode_bytes,
    py_decode_frame,
)
from data_plane.remoting.send_frame import py_send_fields, py_send_ok_frame
from sdk.message import Message, new_unique_id
from sdk.protocol import SendHead

try:
    from data_plane.remoting import _codec
except ImportError:  # not built: only the twin is checked
    _codec = None  # type: ignore[assignment]

compiled = pytest.mark.skipif(_codec is None, reason="the compiled codec is not built")


def frame_of(header: dict[str, Any] | bytes, body: bytes = b"hello", stype: int = 0) -> bytes:
    """A frame as the decoder yields it: header length (type in its high byte), header, body."""
    raw = header if isinstance(header, bytes) else orjson.dumps(header)
    return ((stype << 24) | len(raw)).to_bytes(4, "big") + raw + body


def send_header(**ext: Any) -> dict[str, Any]:
    fields = {"a": "g", "b": "orders", "e": "2", "f": "0", "g": "1700000000123", "h": "0", "i": "", "j": "0"}
    fields.update(ext)
    return {"code": 310, "language": "JAVA", "version": 399, "opaque": 41, "flag": 0, "extFields": fields}


def head_frame(rng: random.Random, body: bytes) -> tuple[bytes, Message, int, str, int]:
    """A frame the SDK lays out (SendHead), for a random message."""
    topic = "".join(rng.choices(string.ascii_letters + "%-_", k=rng.randint(1, 40)))
    props = {f"k{i}": "".join(rng.choices(string.printable, k=rng.randint(0, 30))) for i in range(rng.randint(0, 4))}
    tags = rng.choice([None, "t", "paid refund", "日本"])
    msg = Message(topic, body, tags=tags, properties=props or None)
    queue_id, born = rng.randint(0, 1023), rng.randint(0, 2**45)
    uid = new_unique_id()
    head = SendHead(rng.choice(["grp", "a%b"])).frame(msg, rng.randint(0, 2**31 - 1), queue_id, uid, born)
    assert head is not None
    return head[4:] + body, msg, queue_id, uid, born


@compiled
def test_the_compiled_reader_and_its_twin_give_the_sdks_frames_fields(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        body = rng.randbytes(rng.choice([1, 100, 1024, BODY_VIEW_BYTES - 1, BODY_VIEW_BYTES, BODY_VIEW_BYTES + 7]))
        frame, msg, queue_id, uid, born = head_frame(rng, body)
        got = _codec.send_fields(frame, BODY_VIEW_BYTES)
        assert got == py_send_fields(frame, BODY_VIEW_BYTES)
        opaque, version, topic, q, sys_flag, born_ts, flag, reconsume, props, body_out = got
        cmd = py_decode_frame(frame)
        assert (opaque, version) == (cmd.opaque, cmd.version)
        assert (topic, q, sys_flag, born_ts, flag, reconsume) == (msg.topic, queue_id, 0, born, 0, 0)
        assert props == (cmd.ext_fields or {})["i"]
        assert f"UNIQ_KEY\x01{uid}\x02" in props
        assert bytes(body_out) == body
        # a large body is a view of the frame (no copy), a small one bytes, as decode_frame gives it
        assert isinstance(body_out, memoryview if len(body) >= BODY_VIEW_BYTES else bytes)


@pytest.mark.parametrize("reader", ["compiled", "twin"])
def test_missing_numbers_are_zero_and_missing_properties_empty(reader: str) -> None:
    read = pick(reader)
    header = send_header()
    for name in ("f", "g", "h", "i", "j"):
        del header["extFields"][name]
    header["extFields"]["h"] = ""  # ``int(ext.get("h") or 0)``
    assert read(frame_of(header), BODY_VIEW_BYTES) == (41, 399, "orders", 2, 0, 0, 0, 0, "", b"hello")
    assert read(frame_of({**send_header(), "version": None}), BODY_VIEW_BYTES)[1] == 0


def pick(reader: str) -> Any:
    if reader == "compiled":
        if _codec is None:
            pytest.skip("the compiled codec is not built")
        return _codec.send_fields
    return py_send_fields


NOT_TAKEN = {
    "another request code": {**send_header(), "code": 10},
    "a oneway send (flag 2)": {**send_header(), "flag": 2},
    "a response": {**send_header(), "flag": FLAG_RESPONSE},
    "a batch": send_header(m="true"),
    "no topic": {**send_header(), "extFields": {k: v for k, v in send_header()["extFields"].items() if k != "b"}},
    "no queue id": {**send_header(), "extFields": {k: v for k, v in send_header()["extFields"].items() if k != "e"}},
    "an empty queue id": send_header(e=""),
    "a queue id with a plus": send_header(e="+2"),
    "a queue id with spaces": send_header(e=" 2"),
    "a number with an underscore": send_header(g="1_700"),
    "a number in other digits": send_header(e="٢"),
    "a flag over 32 bits": send_header(h=str(2**31)),
    "a reconsume count under 32 bits": send_header(j=str(-(2**31) - 1)),
    "a born timestamp of 19 digits": send_header(g="1" * 19),
    "no extFields": {**send_header(), "extFields": None},
}


@pytest.mark.parametrize("reader", ["compiled", "twin"])
@pytest.mark.parametrize("case", sorted(NOT_TAKEN))
def test_anything_but_the_common_send_is_left_to_the_command_path(reader: str, case: str) -> None:
    assert pick(reader)(frame_of(NOT_TAKEN[case]), BODY_VIEW_BYTES) is None


@pytest.mark.parametrize("reader", ["compiled", "twin"])
def test_a_send_without_a_body_or_with_a_binary_header_is_left_to_the_command_path(reader: str) -> None:
    read = pick(reader)
    assert read(frame_of(send_header(), body=b""), BODY_VIEW_BYTES) is None
    ext = send_header()["extFields"]
    binary = encode_bytes(RemotingCommand(310, opaque=3, ext_fields=ext, serialize_type=SERIALIZE_ROCKETMQ))
    assert py_decode_frame(binary[4:] + b"x").serialize_type == SERIALIZE_ROCKETMQ
    assert read(binary[4:] + b"x", BODY_VIEW_BYTES) is None
    assert read(b"", BODY_VIEW_BYTES) is None


@compiled
def test_what_the_compiled_reader_leaves_to_the_command_path_besides() -> None:
    """Shapes decode_frame leaves to the Python decoder are left here too: numbers written as
    JSON numbers, a null language, an escaped member name, trailing bytes."""
    cases = [
        {**send_header(), "extFields": {**send_header()["extFields"], "e": 2}},
        {**send_header(), "language": None},
        {**send_header(), "remark": 5},
        {**send_header(), "code": "310"},
    ]
    for header in cases:
        assert _codec.send_fields(frame_of(header), BODY_VIEW_BYTES) is None, header
    raw = orjson.dumps(send_header())
    assert _codec.send_fields(frame_of(raw.replace(b'"code"', b'"\\u0063ode"')), BODY_VIEW_BYTES) is None
    assert _codec.send_fields(frame_of(raw + b" x"), BODY_VIEW_BYTES) is None
    # text that is not UTF-8 makes the JSON invalid, whichever extFields member holds it
    for name in (b"a", b"m", b"zz"):
        bad = frame_of(raw.replace(b'"extFields":{', b'"extFields":{"' + name + b'":"\xff",'))
        assert py_send_fields(bad, BODY_VIEW_BYTES) is None, name
        assert _codec.send_fields(bad, BODY_VIEW_BYTES) is None, name
    # ... while these ordinary variations are taken: whitespace, a null remark, unknown members,
    # an escaped extFields key, members in another order, a later duplicate winning
    spaced = raw.replace(b":", b" : ").replace(b",", b" ,\n")
    assert _codec.send_fields(frame_of(spaced), BODY_VIEW_BYTES) == py_send_fields(frame_of(raw), BODY_VIEW_BYTES)
    other = {"extFields": {**send_header()["extFields"], "zz": "ü", "e": "7", "Authorization": "x"}, "remark": None}
    reordered = {**other, "opaque": 5, "flag": 0, "code": 310, "language": "CPP", "extra": 1}
    got = _codec.send_fields(frame_of(reordered), BODY_VIEW_BYTES)
    assert got is not None
    assert got[:4] == (5, 0, "orders", 7)
    escaped_key = orjson.dumps(send_header()).replace(b'"e":"2"', b'"e":"2","\\u0065":"3"')
    assert _codec.send_fields(frame_of(escaped_key), BODY_VIEW_BYTES)[3] == 3  # the later "e" wins


@compiled
@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_damaged_frame_is_read_as_its_twin_reads_it_or_left_alone(data: st.DataObject) -> None:
    frame = bytearray(frame_of(send_header(i="TAGS\x01t\x02UNIQ_KEY\x01abc\x02")))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    got = _codec.send_fields(bytes(frame), BODY_VIEW_BYTES)  # never raises
    if got is not None:
        assert got == py_send_fields(bytes(frame), BODY_VIEW_BYTES)


@compiled
@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_never_raise(data: bytes) -> None:
    assert _codec.send_fields(data, BODY_VIEW_BYTES) in (None, py_send_fields(data, BODY_VIEW_BYTES))


# --- the SUCCESS frame -------------------------------------------------------------------------------
@compiled
def test_the_compiled_success_frame_is_the_twins_bytes(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        args = (
            rng.randint(-(2**31), 2**31 - 1),
            rng.randint(-(2**31), 2**31 - 1),
            rng.randbytes(rng.choice([8, 20])).hex().upper().encode(),  # IPv4 or IPv6 and a port
            rng.randint(0, 2**63 - 1),
            rng.randint(0, 2**31 - 1),
            rng.randint(0, 2**63 - 1),
        )
        assert _codec.send_ok_frame(*args) == py_send_ok_frame(*args)
    with pytest.raises(TypeError):
        _codec.send_ok_frame(1, 2, "not bytes", 3, 4, 5)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        _codec.send_ok_frame(1, 2, b"AB", 2**64, 4, 5)


def test_the_success_frame_decodes_to_the_answer_the_command_path_gives() -> None:
    frame = py_send_ok_frame(399, 77, b"7F00000100002A9F", 0x4D2, 3, 1234567)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    cmd = py_decode_frame(frame[4:])
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.language) == (0, 77, FLAG_RESPONSE, 399, "JAVA")
    assert cmd.ext_fields == {
        "msgId": "7F00000100002A9F00000000000004D2",
        "queueId": "3",
        "queueOffset": "1234567",
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
