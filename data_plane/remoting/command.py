"""RemotingCommand and its codec: RocketMQ 4.x "remoting" frames, as pure functions.

A frame on the wire (all integers big-endian)::

    ┌──────────────┬─────────────────────────────┬──────────────────┬───────────┐
    │ length  (4)  │ type (1) │ header length (3) │ header (n bytes) │ body      │
    └──────────────┴─────────────────────────────┴──────────────────┴───────────┘
      length counts everything after itself: 4 + header length + body length.

``type`` is the header's serialization: 0 = JSON ``{code, language, version, opaque, flag,
remark, extFields}``, 1 = RocketMQ's binary form::

    code (2) │ language (1) │ version (2) │ opaque (4) │ flag (4) │
    remark length (4) │ remark │ extFields length (4) │ { key length (2) │ key │ value length (4) │ value }*

A response is encoded with the serialization of its request. ``extFields`` are strings on the
wire; real clients send numbers too, so decoding turns every value into a string.

``decode_frame`` takes the compiled twin (``_codec.c``) when it is built and ``ORBIT_PURE_PYTHON``
is not set: it decodes the common JSON header (integer fields, string extFields) and leaves any
other frame to ``py_decode_frame``, the reference, which raises FrameError for a bad one.
``encode`` likewise writes a frame's lengths and common JSON header with ``_codec.frame_head``
(the same bytes as ``py_frame_head``: orjson's), and leaves anything else to the twin.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from data_plane.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1

FRAME_PREFIX = struct.Struct(">II")  # total length, (type << 24) | header length
assert FRAME_PREFIX.size == 8
FRAME_LENGTH = struct.Struct(">I")  # a frame's length prefix (the decoder; TlsReader reads it too)
_BINARY_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
assert _BINARY_FIXED.size == 13
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# What a body may be, for isinstance() as a tuple: ``bytes | bytearray | memoryview`` would make a
# union type object on every call (~130 ns), and these run once a frame or a message.
BODY_TYPES = (bytes, bytearray, memoryview)
_VIEW_TYPES = (bytearray, memoryview)

MAX_FRAME_BYTES = 16 * 1024 * 1024  # default limit on one frame (the length field's value)
MAX_HEADER_BYTES = 1024 * 1024
# A decoded body this large stays a view of the frame's bytes (a pull's records, a batch), not a
# copy: FrameDecoder hands out frames of buffers nothing writes to again. Smaller ones are bytes.
BODY_VIEW_BYTES = 16 * 1024
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# LanguageCode ordinals, for the binary header.
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS")
_LANGUAGE_ORDINAL = {name: i for i, name in enumerate(LANGUAGES)}

Body = bytes | bytearray | memoryview


class FrameError(ValueError):
    """Bytes that are not a well-formed frame. The connection that sent them is closed."""


class FrameTooLarge(FrameError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes is over the {limit}-byte limit")
        self.size = size
        self.limit = limit


class RemotingCommand:
    """One request or response. ``ext_fields`` maps names to strings; ``body`` is bytes, or a
    sequence of buffers written back to back (a pull response's records, without copying)."""

    __slots__ = (
        "body",
        "code",
        "ext_fields",
        "flag",
        "language",
        "opaque",
        "raw_header",
        "remark",
        "serialize_type",
        "version",
    )

    def __init__(
        self,
        code: int,
        *,
        opaque: int = 0,
        flag: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: Body | Sequence[Body] | None = None,
        language: str = "PYTHON",
        version: int = 399,
        serialize_type: int = SERIALIZE_JSON,
    ) -> None:
        self.code = code
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = ext_fields
        self.body = body
        self.language = language
        self.version = version
        self.serialize_type = serialize_type
        # The encoded JSON header, when a hot path built it itself (it must match the fields).
        self.raw_header: bytes | None = None

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def body_bytes(self) -> bytes:
        b = self.body
        if b is None:
            return b""
        if isinstance(b, bytes):
            return b
        if isinstance(b, _VIEW_TYPES):
            return bytes(b)
        return b"".join(b)

    def response(
        self, code: int, remark: str | None = None, ext_fields: dict[str, str] | None = None, body: Any = None
    ) -> RemotingCommand:
        """The response to this request: same opaque, version and serialization."""
        return RemotingCommand(
            code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
            language="JAVA",
            version=self.version,
            serialize_type=self.serialize_type,
        )

    def __repr__(self) -> str:
        kind = "response" if self.is_response else "request"
        return (
            f"RemotingCommand({kind} code={self.code} opaque={self.opaque} flag={self.flag} "
            f"remark={self.remark!r} ext={self.ext_fields!r} body={len(self.body_bytes())}B)"
        )


# --- encoding ------------------------------------------------------------------------------
def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.raw_header is not None:
        return cmd.raw_header
    if cmd.serialize_type == SERIALIZE_ROCKETMQ:
        return _encode_binary_header(cmd)
    h: dict[str, Any] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
        "serializeTypeCurrentRPC": "JSON",
    }
    if cmd.remark is not None:
        h["remark"] = cmd.remark
    if cmd.ext_fields is not None:
        h["extFields"] = cmd.ext_fields
    return orjson.dumps(h)


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    parts = [_BINARY_FIXED.pack(cmd.code, _LANGUAGE_ORDINAL.get(cmd.language, 7), cmd.version, cmd.opaque, cmd.flag)]
    remark = cmd.remark.encode() if cmd.remark else b""
    parts.append(_U32.pack(len(remark)))
    parts.append(remark)
    ext = bytearray()
    for k, v in (cmd.ext_fields or {}).items():
        kb, vb = k.encode(), str(v).encode()
        ext += _U16.pack(len(kb))
        ext += kb
        ext += _U32.pack(len(vb))
        ext += vb
    parts.append(_U32.pack(len(ext)))
    parts.append(bytes(ext))
    return b"".join(parts)


def encode(cmd: RemotingCommand) -> list[Body]:
    """The frame of ``cmd`` as buffers to write back to back (the body is not copied)."""
    body = cmd.body
    if body is None:
        pieces: Sequence[Body] = ()
        body_len = 0
    elif isinstance(body, BODY_TYPES):
        pieces = (body,)
        body_len = len(body)
    else:
        pieces = body
        body_len = sum(len(p) for p in body)
    if compiled_frame_head is not None:
        head = compiled_frame_head(cmd, body_len)
        if head is not None:
            return [head, *pieces]
    return [py_frame_head(cmd, body_len), *pieces]


def py_frame_head(cmd: RemotingCommand, body_len: int) -> bytes:
    """The frame's two lengths and its header (``_codec.frame_head`` is the compiled twin, for
    the common JSON header)."""
    header = encode_header(cmd)
    return FRAME_PREFIX.pack(4 + len(header) + body_len, (cmd.serialize_type << 24) | len(header)) + header


def encode_bytes(cmd: RemotingCommand) -> bytes:
    return b"".join(encode(cmd))


# --- decoding ------------------------------------------------------------------------------
def _as_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, int | float):
        return str(v)
    return orjson.dumps(v).decode()


def py_decode_frame(frame: Body, view_from: int = BODY_VIEW_BYTES) -> RemotingCommand:
    """Decode one frame without its 4-byte length prefix; a body of ``view_from`` bytes or more
    stays a view of ``frame``. Raises FrameError."""
    mv = memoryview(frame)
    if len(mv) < 4:
        raise FrameError("frame shorter than its header-length field")
    (mark,) = FRAME_LENGTH.unpack_from(mv, 0)
    stype = mark >> 24
    hlen = mark & 0xFFFFFF
    if hlen > len(mv) - 4 or hlen > MAX_HEADER_BYTES:
        raise FrameError(f"header length {hlen} does not fit a frame of {len(mv)} bytes")
    header = mv[4 : 4 + hlen]
    if stype == SERIALIZE_JSON:
        cmd = _decode_json_header(header)
    elif stype == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise FrameError(f"unknown header serialization type {stype}")
    cmd.serialize_type = stype
    if len(mv) > 4 + hlen:
        rest = mv[4 + hlen :]
        cmd.body = rest if len(rest) >= view_from else bytes(rest)
    return cmd


def _codec_function(name: str) -> Any:
    from data_plane.remoting import _codec

    return getattr(_codec, name)


def _load_compiled() -> Callable[[Body, type, int], RemotingCommand | None] | None:
    if os.environ.get("ORBIT_PURE_PYTHON"):
        return None
    try:
        from data_plane.remoting import _codec
    except ImportError:  # not built (no compiler): the Python twin serves
        return None
    compiled: Callable[[Body, type, int], RemotingCommand | None] = _codec.decode_frame
    return compiled


compiled_decode_frame = _load_compiled()
compiled_frame_head: Callable[[RemotingCommand, int], bytes | None] | None = (
    None if compiled_decode_frame is None else _codec_function("frame_head")
)


compiled_fill_head: Callable[[tuple[bytes, ...], tuple[str | int, ...], int], bytes | None] | None = (
    None if compiled_decode_frame is None else _codec_function("fill_head")
)


def json_text(text: str) -> bytes:
    """``text`` as a JSON string's inside: escaped as orjson escapes it, without the quotes."""
    return orjson.dumps(text)[1:-1]


def py_fill_head(pieces: tuple[bytes, ...], values: tuple[str | int, ...], body_len: int) -> bytes:
    """A JSON header from a template — ``pieces[0] values[0] pieces[1] ... pieces[n]``, an int
    value in decimal, a str JSON-escaped (``json_text``) — behind the frame's two lengths.
    ``_codec.fill_head`` is the compiled twin."""
    if len(pieces) != len(values) + 1:
        raise ValueError(f"a template of {len(pieces)} pieces takes {len(pieces) - 1} values, not {len(values)}")
    parts = [pieces[0]]
    for value, piece in zip(values, pieces[1:], strict=True):
        if value.__class__ is int:
            parts.append(str(value).encode())
        elif value.__class__ is str:
            parts.append(json_text(value))
        else:
            raise TypeError(f"a header template takes int and str values, not {type(value).__name__}")
        parts.append(piece)
    header = b"".join(parts)
    if len(header) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    return FRAME_PREFIX.pack(4 + len(header) + body_len, (SERIALIZE_JSON << 24) | len(header)) + header


def fill_head(pieces: tuple[bytes, ...], values: tuple[str | int, ...], body_len: int) -> bytes:
    """``py_fill_head``, compiled when built."""
    if compiled_fill_head is not None:
        head = compiled_fill_head(pieces, values, body_len)
        if head is not None and len(head) <= 8 + MAX_HEADER_BYTES:
            return head
    return py_fill_head(pieces, values, body_len)  # (which raises for what C did not take)


def decode_frame(frame: Body) -> RemotingCommand:
    """Decode one frame without its 4-byte length prefix. Raises FrameError."""
    if compiled_decode_frame is not None:
        cmd = compiled_decode_frame(frame, RemotingCommand, BODY_VIEW_BYTES)
        if cmd is not None:
            return cmd
    return py_decode_frame(frame)


def _decode_json_header(raw: memoryview) -> RemotingCommand:
    try:
        h = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise FrameError(f"header is not JSON: {e}") from None
    if not isinstance(h, dict):
        raise FrameError("header is not a JSON object")
    try:
        code = int(h["code"])
        opaque = int(h.get("opaque", 0))
        flag = int(h.get("flag", 0))
        version = int(h.get("version", 0) or 0)
    except (KeyError, TypeError, ValueError) as e:
        raise FrameError(f"header field missing or not a number: {e}") from None
    lo, hi = _INT32_MIN, _INT32_MAX
    if not (lo <= code <= hi and lo <= opaque <= hi and lo <= flag <= hi and lo <= version <= hi):
        # Java's fields are ints; an opaque out of range could not even be answered.
        raise FrameError("a header number is outside the range of a 32-bit int")
    ext = h.get("extFields")
    ext_fields: dict[str, str] | None
    if ext is None:
        ext_fields = None
    elif isinstance(ext, dict):
        ext_fields = ext
        for v in ext.values():
            if v.__class__ is not str:  # a client habit: numbers and booleans; rebuild as strings
                ext_fields = {str(k): _as_str(v) for k, v in ext.items()}
                break
    else:
        raise FrameError("extFields is not an object")
    remark = h.get("remark")
    return RemotingCommand(
        code,
        opaque=opaque,
        flag=flag,
        remark=None if remark is None else _as_str(remark),
        ext_fields=ext_fields,
        language=_as_str(h.get("language", "OTHER")),
        version=version,
    )


def _decode_binary_header(raw: memoryview) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BINARY_FIXED.unpack_from(raw, 0)
        pos = _BINARY_FIXED.size
        (rlen,) = _U32.unpack_from(raw, pos)
        pos += 4
        if pos + rlen > len(raw):
            raise FrameError("remark runs past the header")
        remark = bytes(raw[pos : pos + rlen]).decode() if rlen else None
        pos += rlen
        (elen,) = _U32.unpack_from(raw, pos)
        pos += 4
        end = pos + elen
        if end > len(raw):
            raise FrameError("extFields run past the header")
        ext: dict[str, str] | None = {} if elen else None
        while pos < end:
            (klen,) = _U16.unpack_from(raw, pos)
            pos += 2
            key = bytes(raw[pos : pos + klen]).decode()
            pos += klen
            (vlen,) = _U32.unpack_from(raw, pos)
            pos += 4
            if pos + vlen > end:
                raise FrameError("an extFields value runs past the header")
            assert ext is not None
            ext[key] = bytes(raw[pos : pos + vlen]).decode()
            pos += vlen
    except struct.error as e:
        raise FrameError(f"binary header truncated: {e}") from None
    except UnicodeDecodeError as e:
        raise FrameError(f"binary header text is not UTF-8: {e}") from None
    language = LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER"
    return RemotingCommand(
        code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext, language=language, version=version
    )


class FrameDecoder:
    """Splits a byte stream into frames. ``feed`` returns the complete frames (each without
    its length prefix, as a memoryview of bytes nothing writes to again: no copy per frame) and
    keeps the rest; a length over ``max_frame_bytes`` or under 4 raises FrameError before
    anything of that frame is buffered. A frame spread over many reads keeps the reads as they
    are and is joined once, when its last byte arrives (one exact-size copy of that frame only:
    the frames after it in the same read stay views of the read).

    ``pending`` is, after each ``feed``, the size of the incomplete frame held (its length
    prefix included: 4 while the prefix itself is cut) or 0 when nothing is held; it changes
    only when a frame starts, learns its length or ends, which is what a server's inbound limits
    (``limits.py``) look at, once a read."""

    __slots__ = ("_have", "_need", "_parts", "max_frame_bytes", "pending")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._parts: list[Body] = []  # the reads holding the start of the next frame
        self._have = 0  # their bytes
        self._need = 0  # bytes the parts must hold before the next frame is complete
        self.pending = 0  # _need while parts are held, else 0
        self.max_frame_bytes = max_frame_bytes

    @property
    def buffered(self) -> int:
        return self._have

    def reset(self) -> None:
        """Let go of the incomplete frame held (its connection is gone)."""
        self._parts = []
        self._have = self._need = self.pending = 0

    def _check(self, length: int) -> None:
        if length > self.max_frame_bytes:
            raise FrameTooLarge(length, self.max_frame_bytes)
        if length < 4:
            raise FrameError(f"frame length {length} is shorter than its header-length field")

    def feed(self, data: Body) -> list[Body]:
        src = data if isinstance(data, bytes) else bytes(data)  # frames are views: of bytes only
        frames: list[Body] = []
        pos = 0
        if self._parts:
            self._have += len(src)
            if self._have < self._need:
                self._parts.append(src)
                return []
            if self._need > 4:  # a frame whose length is known: join it alone, not the whole read
                take = len(src) - (self._have - self._need)
                self._parts.append(memoryview(src)[:take])
                frames.append(memoryview(b"".join(self._parts))[4:])
                pos = take
            else:  # the length prefix itself was cut: join the few bytes with this read
                self._parts.append(src)
                src = b"".join(self._parts)
            self._parts = []
            self._have = 0
        mv = memoryview(src)
        n = len(mv)
        unpack = FRAME_LENGTH.unpack_from
        while n - pos >= 4:
            (length,) = unpack(mv, pos)
            if length > self.max_frame_bytes or length < 4:
                self._check(length)  # (raises)
            end = pos + 4 + length
            if end > n:
                break
            frames.append(mv[pos + 4 : end])
            pos = end
        if pos < n:  # the start of the next frame: its length is checked above when it has one
            self._parts.append(mv[pos:])
            self._have = n - pos
            self._need = self.pending = 4 + unpack(mv, pos)[0] if n - pos >= 4 else 4
        else:
            self.pending = 0
        return frames
