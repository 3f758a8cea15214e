"""The SEND_MESSAGE_V2 head laid out from a template (``protocol.SendHead``, ``command.fill_head``
and its compiled twin ``_codec.fill_head``): the same bytes as the command path
(``send_request`` → ``encode``) for every message it takes, None for the ones it leaves to that
path, and clear errors from the template fill itself."""

from __future__ import annotations

import random

import pytest

from data_plane.remoting.command import (
    MAX_HEADER_BYTES,
    FrameError,
    compiled_fill_head,
    decode_frame,
    encode,
    fill_head,
    json_text,
    py_fill_head,
)
from sdk import Message, protocol

# Text a property value or a tag may hold: JSON's escapes, control characters the SDK lets
# through, non-ASCII (two-, three- and four-byte UTF-8).
ODD = ['"', "\\", "/", "\t", "\n", "\x7f", "\x1f", "é", "漢", "😀", " ", "a", "Z", "0", "\x03"]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ODD) for _ in range(n))


def _message(rng: random.Random) -> Message:
    props = {f"p{i}{_text(rng, 2).strip()}": _text(rng, rng.randint(0, 12)) for i in range(rng.randint(0, 3))}
    tags = rng.choice([None, "bench", "t" + _text(rng, rng.randint(1, 8)).replace("||", "|")])
    if tags is not None and not tags.strip():
        tags = "x"
    body = rng.randbytes(rng.randint(1, 3000))
    return Message(rng.choice(["T", "orders-2026", "A_b-c%d|e"]), body, tags=tags, properties=props or None)


def _reference(group: str, msg: Message, opaque: int, queue_id: int, uid: str, born_ms: int) -> bytes:
    cmd = protocol.send_request(group=group, msg=msg, queue_id=queue_id, unique_id=uid, born_timestamp_ms=born_ms)
    cmd.opaque = opaque
    head, body = encode(cmd)
    assert body is msg.body
    return bytes(head)


def test_the_head_is_the_command_paths_for_random_messages(seed: int) -> None:
    rng = random.Random(seed)
    for group in ["bench-open-loop", "g", 'grp "quoted" \\ é']:
        template = protocol.SendHead(group)
        for _ in range(300):
            msg = _message(rng)
            opaque = rng.choice([0, 1, rng.randrange(1 << 31)])
            queue_id = rng.choice([0, 7, 1023, 1024, rng.randrange(100_000)])
            born_ms = rng.choice([0, rng.randrange(1 << 45)])
            uid = "".join(rng.choice("0123456789ABCDEF") for _ in range(32))
            got = template.frame(msg, opaque, queue_id, uid, born_ms)
            assert got == _reference(group, msg, opaque, queue_id, uid, born_ms), (group, msg, msg.properties)
            cmd = decode_frame(memoryview(got + msg.body)[4:])  # and the broker reads it as sent
            ext = cmd.ext_fields or {}
            assert (cmd.opaque, ext["a"], ext["b"], ext["e"], ext["g"]) == (
                opaque, group, msg.topic, str(queue_id), str(born_ms),
            )  # fmt: skip
            assert bytes(cmd.body_bytes()) == msg.body


def test_messages_with_keys_or_a_schedule_are_left_to_the_command_path() -> None:
    template = protocol.SendHead("g")
    for msg in [
        Message("T", b"x", keys="k1"),
        Message("T", b"x", delay_level=3),
        Message("T", b"x", deliver_at_ms=2_000_000_000_000),
    ]:
        assert template.frame(msg, 1, 0, "ID", 5) is None
    assert template.frame(Message("T", b"x"), 1, 0, "ID", 5) is not None


@pytest.mark.skipif(compiled_fill_head is None, reason="the compiled codec is not built")
def test_the_compiled_fill_is_the_python_fill(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        n = rng.randint(0, 8)
        pieces = tuple(json_text(_text(rng, rng.randint(0, 6))).replace(b"\\", b"") for _ in range(n + 1))
        choices: list[str | int] = [rng.randrange(-(1 << 62), 1 << 62), _text(rng, rng.randint(0, 40)), 0, -1, ""]
        values = tuple(rng.choice(choices) for _ in range(n))
        body_len = rng.randrange(1 << 20)
        assert compiled_fill_head is not None
        assert compiled_fill_head(pieces, values, body_len) == py_fill_head(pieces, values, body_len), (pieces, values)


def test_a_fill_that_does_not_fit_its_template_is_an_error() -> None:
    with pytest.raises(ValueError, match="takes 2 values, not 1"):
        fill_head((b"a", b"b", b"c"), (1,), 0)
    with pytest.raises(TypeError, match="int and str values, not float"):
        fill_head((b"a", b"b"), (1.5,), 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not bool"):
        fill_head((b"a", b"b"), (True,), 0)
    with pytest.raises(FrameError, match="exceeds"):
        fill_head((b"{", b"}"), ("x" * (MAX_HEADER_BYTES + 1),), 0)
    with pytest.raises(TypeError, match="surrogates"):
        fill_head((b"{", b"}"), ("\ud800",), 0)  # a lone surrogate is not UTF-8


def test_the_lengths_count_the_header_and_the_body() -> None:
    head = fill_head((b'{"a":', b"}"), (7,), 100)
    assert head[8:] == b'{"a":7}'
    assert int.from_bytes(head[:4], "big") == 4 + 7 + 100
    assert int.from_bytes(head[4:8], "big") == 7  # serialize type 0 (JSON) in the high byte


def test_a_bearer_tokens_field_ends_the_extfields_as_the_command_paths_signing_adds_it(seed: int) -> None:
    """With ``auth`` (a credential's fields, as ``ClientInstance.send_connection`` makes them)
    the head is the command path's after the credentials hook merged its fields in
    (``ClientInstance._sign``); the token can change between sends, and go again."""
    rng = random.Random(seed)
    template = protocol.SendHead("tenant%producer")
    tokens = ["eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "t" + _text(rng, 20), "x.y.z"]
    for i in range(200):
        token = tokens[i % 3] if i % 5 else None
        msg = _message(rng)
        opaque, queue_id, born_ms = rng.randrange(1 << 31), rng.randrange(1024), rng.randrange(1 << 45)
        uid = "".join(rng.choice("0123456789ABCDEF") for _ in range(32))
        fields = {"Authorization": f"Bearer {token}"} if token is not None else {}
        auth = b"".join(b',"%b":"%b"' % (json_text(k), json_text(v)) for k, v in fields.items())
        got = template.frame(msg, opaque, queue_id, uid, born_ms, auth)
        cmd = protocol.send_request(
            group="tenant%producer", msg=msg, queue_id=queue_id, unique_id=uid, born_timestamp_ms=born_ms
        )
        cmd.opaque = opaque
        cmd.ext_fields = {**(cmd.ext_fields or {}), **fields}
        assert got == bytes(encode(cmd)[0]), (token, msg)
        ext = decode_frame(memoryview(got + msg.body)[4:]).ext_fields or {}
        assert ext.get("Authorization") == (f"Bearer {token}" if token is not None else None)
