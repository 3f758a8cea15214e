"""The compiled frame decoder (data_plane/remoting/_codec.c) against its Python twin
(command.py_decode_frame): the same command for every frame it takes, and None — the frame left
to the twin — for every frame it does not, bad frames included. The compiled encoder of a
frame's head (``frame_head``) against ``py_frame_head``: the same bytes, or None."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import (
    BODY_VIEW_BYTES,
    SERIALIZE_ROCKETMQ,
    FrameError,
    RemotingCommand,
    decode_frame,
    encode,
    encode_bytes,
    py_decode_frame,
    py_frame_head,
)
from tests.conftest import compiled_missing

Compiled = Callable[[Any, type], RemotingCommand | None]


@pytest.fixture
def compiled() -> Compiled:
    try:
        from data_plane.remoting import _codec
    except ImportError:
        compiled_missing("data_plane.remoting._codec")

    def fn(frame: Any, cls: type) -> RemotingCommand | None:
        got: RemotingCommand | None = _codec.decode_frame(frame, cls, BODY_VIEW_BYTES)
        return got

    return fn


def fields(cmd: RemotingCommand) -> dict[str, Any]:
    out = {name: getattr(cmd, name) for name in RemotingCommand.__slots__}
    out["types"] = {name: type(v) for name, v in out.items()}
    out["ext_types"] = sorted({type(v).__name__ for v in (cmd.ext_fields or {}).values()})
    return out


def frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    """A frame without its 4-byte total length (what the decoders take)."""
    return struct.pack(">I", (stype << 24) | len(header)) + header + body


def same(compiled: Compiled, f: bytes | memoryview) -> RemotingCommand | None:
    """The compiled answer, checked against the Python twin's (a command equal in every slot, or
    None when the twin raises FrameError)."""
    got = compiled(f, RemotingCommand)
    try:
        want = py_decode_frame(f)
    except FrameError:
        assert got is None, bytes(f)[:200]
        return None
    if got is not None:
        assert fields(got) == fields(want), bytes(f)[:200]
    assert fields(decode_frame(f)) == fields(want)
    return got


TEXTS = ["", "a", "TBW102", "é中", "😀 not in the BMP", 'quote " and \\ back', "\x01\x02\n\t\x00\x7f", "x" * 300]


def random_command(rng: random.Random) -> RemotingCommand:
    ext = None
    if rng.random() < 0.9:
        ext = {rng.choice([*TEXTS, "a", "b", "topic", "queueId"]): rng.choice(TEXTS) for _ in range(rng.randrange(12))}
    return RemotingCommand(
        rng.choice([0, 10, 310, 320, -1, 2**31 - 1, -(2**31)]),
        opaque=rng.randrange(-(2**31), 2**31),
        flag=rng.choice([0, 1, 2, 3]),
        remark=rng.choice([None, *TEXTS]),
        ext_fields=ext,
        body=rng.choice([None, b"", b"body", rng.randbytes(rng.randrange(2000)), rng.randbytes(BODY_VIEW_BYTES)]),
        language=rng.choice(["JAVA", "PYTHON", "CPP", "", "é"]),
        version=rng.choice([0, 399, 2**31 - 1]),
    )


def test_frames_the_encoder_writes_are_all_taken_and_decoded_as_by_python(compiled: Compiled, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        f = encode_bytes(random_command(rng))[4:]
        assert same(compiled, f) is not None
        assert same(compiled, memoryview(f)) is not None


@pytest.mark.parametrize(
    "header",
    [
        # What other clients write: spaces, another member order, members this side ignores.
        b' { "code" : 310 , "extFields" : { "a" : "g" , "e" : "1" } , "flag" : 0 ,\n"language" : "JAVA" ,'
        b' "opaque" : 7 , "serializeTypeCurrentRPC" : "JSON" , "version" : 373 }\r\n\t',
        b'{"code":34,"language":"CPP","opaque":1,"flag":0,"version":1,"rocketmqVersion":"V4_9_4","x":1.5,'
        b'"y":-0.25,"z":true,"w":false,"v":null,"u":12345}',
        # Escapes: \uXXXX (the separators RocketMQ's properties use), \/, the short ones.
        b'{"code":10,"extFields":{"properties":"TAGS\\u0001A\\u0002KEYS\\u0001k\\u0002","p":"a\\/b\\\\c\\"d\\n\\t"},'
        b'"remark":"caf\\u00e9 \\u4e2d \\b\\f\\r"}',
        # Defaults: no opaque, flag or version; no language ("OTHER"); null extFields and remark.
        b'{"code":105}',
        b'{"code":105,"extFields":null,"remark":null,"version":null}',
        b'{"code":105,"extFields":{}}',
        # A repeated member: the last one counts, as in orjson.
        b'{"code":1,"code":2,"extFields":{"k":"a","k":"b"},"extFields":{"k":"c"}}',
        b'{"code":-0,"opaque":-2147483648,"flag":2147483647}',
    ],
)
def test_headers_other_clients_write_are_taken(compiled: Compiled, header: bytes) -> None:
    assert same(compiled, frame(header, b"payload")) is not None


@pytest.mark.parametrize(
    "header",
    [
        b'{"code":"310"}',  # a number as a string
        b'{"code":310,"extFields":{"queueId":4}}',  # an extFields value that is not a string
        b'{"code":310,"extFields":{"b":true}}',
        b'{"code":310.0}',
        b'{"code":true}',
        b'{"code":1e2}',
        b'{"code":1,"x":1e400}',  # not a double: orjson refuses it
        b'{"code":1,"x":123456789012345678901234567890}',
        b'{"code":2147483648}',  # outside an int
        b'{"code":1,"language":null}',  # the twin makes it ""
        b'{"code":1,"remark":5}',
        b'{"code":1,"x":[1,2]}',
        b'{"code":1,"x":{"y":1}}',
        b'{"code":1,"extFields":[]}',
        b'{"c\\u006fde":1}',  # an escaped member name
        b'{"code":1,"remark":"\\ud83d\\ude00"}',  # surrogate escapes
        b'{"code":1,"remark":"\\ud800"}',
        b'{"opaque":1}',  # no code
        b"[]",
        b"",
        b'{"code":1,}',  # bad JSON from here on: the twin raises FrameError
        b'{"code":01}',
        b'{"code":1} x',
        b'{"code":1,"remark":"a\nb"}',  # a raw control character in a string
        b'{"code":1,"remark":"\xff"}',  # not UTF-8
        b'{"code":1,"extFields":{"\xc3":"v"}}',
        b'{"code":1,"\xff":"v"}',
        b'{"code":1,"remark":"\\x"}',
        b'{"code":1,"remark":"\\u12"}',
        b'{"code":1,"remark":"abc',
        b'{"code":1',
    ],
)
def test_other_headers_are_left_to_python(compiled: Compiled, header: bytes) -> None:
    assert compiled(frame(header), RemotingCommand) is None
    same(compiled, frame(header))


def test_a_large_body_is_a_view_of_the_frame_and_a_small_one_is_bytes(compiled: Compiled) -> None:
    header = orjson.dumps({"code": 11, "flag": 1})
    big = bytearray(frame(header, b"r" * BODY_VIEW_BYTES))
    for cmd in (compiled(big, RemotingCommand), py_decode_frame(big)):
        assert cmd is not None
        assert isinstance(cmd.body, memoryview)
        assert bytes(cmd.body) == b"r" * BODY_VIEW_BYTES
        big[-1] = ord("s")  # a view: it sees the frame's bytes (which FrameDecoder never reuses)
        assert bytes(cmd.body[-1:]) == b"s"
        big[-1] = ord("r")
    small = frame(header, b"r" * (BODY_VIEW_BYTES - 1))
    for cmd in (compiled(small, RemotingCommand), py_decode_frame(small)):
        assert cmd is not None
        assert type(cmd.body) is bytes


def test_binary_headers_and_short_frames_are_left_to_python(compiled: Compiled) -> None:
    binary = encode_bytes(RemotingCommand(34, opaque=3, ext_fields={"a": "b"}, serialize_type=SERIALIZE_ROCKETMQ))
    assert compiled(binary[4:], RemotingCommand) is None
    assert same(compiled, binary[4:]) is None  # the twin takes it
    assert decode_frame(binary[4:]).ext_fields == {"a": "b"}
    for short in (b"", b"\x00", b"\x00\x00\x00", b"\x00\x00\x00\x09{}", struct.pack(">I", 2**24 - 1) + b"{}"):
        assert compiled(short, RemotingCommand) is None
        with pytest.raises(FrameError):
            py_decode_frame(short)


def test_mutated_frames_are_decoded_as_by_python_or_left_to_it(compiled: Compiled, seed: int) -> None:
    rng = random.Random(seed)
    taken = 0
    for _ in range(3000):
        f = bytearray(encode_bytes(random_command(rng))[4:])
        hlen = struct.unpack_from(">I", f)[0] & 0xFFFFFF
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(4, 4 + hlen) if hlen else 0
            how = rng.randrange(3)
            if how == 0:
                f[at] = rng.randrange(256)
            elif how == 1:
                f[at] = ord(rng.choice('{}[]",:\\ 0123456789-.eEtrufalsn'))
            else:
                del f[at]
                hlen -= 1
                f[1:4] = (hlen & 0xFFFFFF).to_bytes(3, "big")
        taken += same(compiled, bytes(f)) is not None
    assert taken > 0  # a change of a value's bytes leaves many frames well formed


def test_the_command_class_must_have_the_slots(compiled: Compiled) -> None:
    class Other:
        pass

    with pytest.raises(TypeError):
        compiled(frame(b'{"code":1}'), Other)
    ok = compiled(frame(orjson.dumps({"code": 1})), RemotingCommand)
    assert ok is not None
    assert ok.code == 1


# --- encoding: _codec.frame_head against command.py_frame_head ---------------------------------------
@pytest.fixture
def frame_head() -> Callable[[RemotingCommand, int], bytes | None]:
    try:
        from data_plane.remoting import _codec
    except ImportError:
        compiled_missing("data_plane.remoting._codec")
    fn: Callable[[RemotingCommand, int], bytes | None] = _codec.frame_head
    return fn


def test_frame_head_writes_the_bytes_the_python_twin_writes(
    frame_head: Callable[[RemotingCommand, int], bytes | None], seed: int
) -> None:
    rng = random.Random(seed)
    for i in range(2000):
        cmd = random_command(rng)
        if i % 3 == 0:
            cmd.code = rng.choice(list(RequestCode) + list(ResponseCode))  # IntEnums are their values
        if i % 7 == 0:
            cmd.opaque = rng.choice([2**63 - 1, -(2**63), 0])
        body_len = rng.randrange(2**20)
        got = frame_head(cmd, body_len)
        assert got is not None, cmd  # every command here has the common JSON header
        assert got == py_frame_head(cmd, body_len), cmd
        assert b"".join(encode(cmd)) == py_frame_head(cmd, len(cmd.body_bytes())) + cmd.body_bytes()


@pytest.mark.parametrize(
    "change",
    [
        {"serialize_type": SERIALIZE_ROCKETMQ},
        {"code": True},  # orjson writes a bool as true
        {"opaque": 2**63},  # beyond 8 bytes
        {"ext_fields": {"a": 1}},  # a number: orjson writes it as one
        {"ext_fields": {"a": "lone \ud800 surrogate"}},  # not UTF-8: the twin raises
        {"ext_fields": {f"k{i}": "v" for i in range(33)}},  # more fields than a hot path's
        {"remark": 5},
    ],
)
def test_frame_head_leaves_other_commands_to_the_python_twin(
    frame_head: Callable[[RemotingCommand, int], bytes | None], change: dict[str, Any]
) -> None:
    cmd = RemotingCommand(310, opaque=7, ext_fields={"a": "b"}, body=b"x")
    for name, value in change.items():
        setattr(cmd, name, value)
    assert frame_head(cmd, 1) is None
    # A raw header (the broker's preformatted SEND OK) is taken as it is by both.
    with_raw = RemotingCommand(0, opaque=1)
    with_raw.raw_header = b'{"code":0}'
    assert py_frame_head(with_raw, 3) == struct.pack(">II", 4 + 10 + 3, 10) + b'{"code":0}'
    assert frame_head(with_raw, 3) == py_frame_head(with_raw, 3)
    with_raw.raw_header = bytearray(b'{"code":0}')  # type: ignore[assignment]  # not bytes: the twin's
    assert frame_head(with_raw, 3) is None
