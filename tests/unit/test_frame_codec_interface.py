"""The frame codec's two implementations (remoting/frame_codec.py) driven through one interface,
``FrameCodec``: the compiled ``_codec`` and ``PythonFrameCodec`` give the same commands and the
same bytes for what both take (test_frame_codec.py compares the twins on damaged frames too)."""

from __future__ import annotations

import random

import pytest

from data_plane.remoting import frame_codec
from data_plane.remoting.command import RemotingCommand, encode_bytes
from data_plane.remoting.frame_codec import PYTHON, FrameCodec, PythonFrameCodec

pytestmark = pytest.mark.unit

COMPILED = frame_codec.compiled()
CODECS = [pytest.param(PYTHON, id="python")] + ([pytest.param(COMPILED, id="compiled")] if COMPILED is not None else [])


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
        frame = encode_bytes(cmd)[4:]
        got = codec.decode_frame(frame, RemotingCommand, 16 * 1024)
        want = PYTHON.decode_frame(frame, RemotingCommand, 16 * 1024)
        assert got is not None, (seed, frame[:80])
        assert (got.code, got.opaque, got.remark, got.ext_fields, bytes(got.body or b"")) == (
            cmd.code, cmd.opaque, cmd.remark, cmd.ext_fields, cmd.body or b"",
        ), seed  # fmt: skip
        assert (got.code, got.ext_fields, bytes(got.body or b"")) == (
            want.code,
            want.ext_fields,
            bytes(want.body or b""),
        )
        # A body of view_from bytes or more stays a view of the frame; a shorter one is copied.
        if len(cmd.body or b"") >= 16 * 1024:
            assert isinstance(got.body, memoryview), seed
        elif cmd.body:
            assert isinstance(got.body, bytes), seed


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_lays_out_the_same_heads_and_answers(codec: FrameCodec) -> None:
    rng = random.Random(7)
    for _ in range(50):
        cmd = _request(rng)
        head = codec.frame_head(cmd, len(cmd.body or b""))
        if head is not None:  # the compiled codec leaves uncommon headers to the Python one
            assert head == PYTHON.frame_head(cmd, len(cmd.body or b""))
    ok = codec.send_ok_frame(1, 42, b"7F00000100002A9F", 4096, 3, 17)
    assert ok == PYTHON.send_ok_frame(1, 42, b"7F00000100002A9F", 4096, 3, 17)
    assert PYTHON.decode_frame(ok[4:], RemotingCommand, 1).ext_fields["queueOffset"] == "17"


def test_the_python_codec_decodes_only_into_remoting_commands() -> None:
    frame = encode_bytes(RemotingCommand(105))[4:]
    with pytest.raises(TypeError, match="RemotingCommand"):
        PythonFrameCodec.decode_frame(frame, dict, 1024)
