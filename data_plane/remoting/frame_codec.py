"""The remoting frame codec as one interface: ``FrameCodec``, what the compiled ``_codec``
module offers (``_codec.pyi``) and what ``PythonFrameCodec``, its pure-Python twin, offers call
for call. ``command.py`` and ``send_frame.py`` hold the Python functions and pick the compiled
ones when built; the twin tests drive both through this interface.

Where the compiled call answers None it did not take the frame (a header it does not decode,
a value out of its range) and the caller goes on with the Python function, which decodes it
or raises FrameError; the Python twin never answers None for that reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from data_plane.remoting import command, send_frame
from data_plane.remoting.command import Body, RemotingCommand


class FrameCodec(Protocol):
    def decode_frame(self, frame: Body, cls: type, view_from: int, /) -> Any: ...

    def frame_head(self, cmd: Any, body_len: int, /) -> bytes | None: ...

    def send_ok_frame(
        self, version: int, opaque: int, host_hex: bytes, wrote_offset: int, queue_id: int, queue_offset: int, /
    ) -> bytes: ...

    def send_fields(self, frame: Body, view_from: int, /) -> Any: ...

    def fill_head(self, pieces: Any, values: Any, body_len: int, /) -> bytes | None: ...


class PythonFrameCodec:
    """The pure-Python ``FrameCodec``: the reference for the compiled one."""

    @staticmethod
    def decode_frame(frame: Body, cls: type, view_from: int, /) -> RemotingCommand:
        if cls is not RemotingCommand:
            raise TypeError(f"the Python codec decodes into RemotingCommand, not {cls.__name__}")
        return command.py_decode_frame(frame, view_from)

    @staticmethod
    def frame_head(cmd: RemotingCommand, body_len: int, /) -> bytes:
        return command.py_frame_head(cmd, body_len)

    @staticmethod
    def send_ok_frame(
        version: int, opaque: int, host_hex: bytes, wrote_offset: int, queue_id: int, queue_offset: int, /
    ) -> bytes:
        return send_frame.py_send_ok_frame(version, opaque, host_hex, wrote_offset, queue_id, queue_offset)

    @staticmethod
    def send_fields(frame: Body, view_from: int, /) -> send_frame.SendFields | None:
        return send_frame.py_send_fields(frame, view_from)

    @staticmethod
    def fill_head(pieces: tuple[bytes, ...], values: tuple[str | int, ...], body_len: int, /) -> bytes:
        return command.py_fill_head(pieces, values, body_len)


PYTHON: FrameCodec = PythonFrameCodec()


def compiled() -> FrameCodec | None:
    """``_codec`` when ``command.py`` uses it (built, and ``ORBIT_PURE_PYTHON`` not set), else None."""
    if command.compiled_decode_frame is None:
        return None
    from data_plane.remoting import _codec

    return _codec


if TYPE_CHECKING:  # the compiled module's stub satisfies the Protocol too
    from data_plane.remoting import _codec as _stub

    _checked: FrameCodec = _stub
