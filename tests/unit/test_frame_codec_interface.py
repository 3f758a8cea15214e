"""The frame codec's two implementations (remoting/frame_codec.py) driven through one interface,
``FrameCodec``: the compiled ``_codec`` and ``PythonFrameCodec`` give the same commands and the
same bytes for what both take (test_frame_codec.py and test_send_frame.py compare the twins on
damaged and random frames too)."""

from __future__ import annotations

import random

import pytest

from data_plane.remoting import frame_codec
from data_plane.remoting.command import RemotingCommand, encode_bytes
from data_plane.remoting.frame_codec import PYTHON, FrameCodec, PythonFrameCodec
from sdk.message import Message, new_unique_id
from sdk.protocol import SendHead

pytestmark = pytest.mark.unit

COMPILED = frame_codec.compiled()
compiled_only = pytest.mark.skipif(COMPILED is None, reason="the compiled codec is not built or not in use")
CODECS = [pytest.param(PYTHON, id="python")] + ([pytest.param(COMPILED, id="compiled")] if COMPILED else [])
VIEW_FROM = 16 * 1024


def _request(rng: random.Random) -> RemotingCommand:
    ext = {f"k{i}": rng.choice(["v", "ü", "a b", str(rng.randrange(10**6))]) for i in range(rng.randrange(4))}
    cmd = RemotingCommand(rng.choice([10, 11, 105, 310]), ext_fields=ext, remark=rng.choice([None, "r"]))
    cmd.opaque = rng.randrange(2**31)
    cmd.body = rng.randbytes(rng.choice([0, 5, 20_000]))
    return cmd


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_decodes_what_the_encoder_wrote(codec: FrameCodec) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(200):
        cmd = _request(rng)
        got = codec.decode_frame(encode_bytes(cmd)[4:], RemotingCommand, VIEW_FROM)
        assert got is not None, seed  # a common JSON header: both take it
        assert (got.code, got.opaque, got.remark, got.ext_fields, bytes(got.body or b"")) == (
            cmd.code, cmd.opaque, cmd.remark, cmd.ext_fields, cmd.body or b"",
        ), seed  # fmt: skip
        # A body of view_from bytes or more stays a view of the frame; a shorter one is copied.
        if len(cmd.body or b"") >= VIEW_FROM:
            assert isinstance(got.body, memoryview), seed
        elif cmd.body:
            assert isinstance(got.body, bytes), seed


@compiled_only
def test_the_compiled_codec_lays_out_the_python_codecs_bytes() -> None:
    assert COMPILED is not None
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    heads = 0
    for _ in range(100):
        cmd = _request(rng)
        head = COMPILED.frame_head(cmd, len(cmd.body or b""))
        if head is not None:  # it leaves uncommon headers (a remark, say) to the Python codec
            heads += 1
            assert head == PYTHON.frame_head(cmd, len(cmd.body or b"")), seed
    assert heads >= 20, (seed, heads)  # the common header is its to lay out
    args = (1, 42, b"7F00000100002A9F", 4096, 3, 17)
    assert COMPILED.send_ok_frame(*args) == PYTHON.send_ok_frame(*args)
    send = SendHead("group")
    for i in range(50):
        msg = Message("acme%orders", rng.randbytes(rng.randrange(1, 3000)), tags=rng.choice([None, "t"]))
        pieces = send.plain if msg.tags is None else send.tagged
        values: tuple[str | int, ...] = (i, msg.topic, 1, 1_700_000_000_000, msg.user_properties_text())
        values += ((msg.tags,) if msg.tags is not None else ()) + (new_unique_id(),)
        head = COMPILED.fill_head(pieces, values, len(msg.body))
        assert head is not None, seed
        assert head == PYTHON.fill_head(pieces, values, len(msg.body)), seed
        frame = head[4:] + msg.body
        got, want = COMPILED.send_fields(frame, VIEW_FROM), PYTHON.send_fields(frame, VIEW_FROM)
        assert got is not None, seed
        assert want is not None, seed
        assert tuple(got[:-1]) == tuple(want[:-1]), seed
        assert bytes(got[-1]) == bytes(want[-1]) == msg.body, seed
        assert (got[2], got[3]) == ("acme%orders", 1)


def test_the_python_codec_answers_the_success_frame_it_decodes() -> None:
    ok = PYTHON.send_ok_frame(1, 42, b"7F00000100002A9F", 4096, 3, 17)
    got = PYTHON.decode_frame(ok[4:], RemotingCommand, VIEW_FROM)
    assert (got.opaque, got.ext_fields["queueId"], got.ext_fields["queueOffset"]) == (42, "3", "17")


def test_the_python_codec_decodes_only_into_remoting_commands() -> None:
    frame = encode_bytes(RemotingCommand(105))[4:]
    with pytest.raises(TypeError, match="RemotingCommand"):
        PythonFrameCodec.decode_frame(frame, dict, 1024)
