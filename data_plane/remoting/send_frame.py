"""SEND_MESSAGE_V2's fields read straight off a frame, for the broker's plain single send.

The single send is the broker's most frequent request. Its command path decodes the frame into
a ``RemotingCommand`` with an extFields dict of a dozen strings, hands it through the request
table to the send handler, which parses the numbers it needs out of those strings again.
``send_fields`` reads just those values off the frame's bytes: the opaque and version the answer
echoes, and the topic, queue id, system flag, born timestamp, flag, reconsume count, properties
text and body the store's ``append_plain`` takes. The broker then stores and answers such a
send without making a command object (``SendProcessor.send_frame``, ``Connection.frame_handler``).

It takes only the common shape — what ``_codec.decode_frame`` takes, code 310, flag 0 (a request
that wants its answer), string extFields with the topic ("b") and queue id ("e"), numbers in the
strict form clients write, "m" (batch) not "true", a body — and returns None for anything else:
that frame takes the command path, which answers it or says what is wrong with it.

The answer to such a send, SUCCESS with the message's id, queue and queue offset, is one
header shape, ``SEND_OK_HEADER``; ``send_ok_frame`` lays out its whole frame.

``send_fields`` and ``send_ok_frame`` are ``_codec``'s when the extension is built and
``ORBIT_PURE_PYTHON`` is unset, else their Python twins: ``py_send_fields`` (built on
``py_decode_frame``; it may take frames the compiled one leaves to the command path, such as
numbers written as JSON numbers, and gives the same values wherever both take a frame) and
``py_send_ok_frame`` (the same bytes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import (
    FRAME_PREFIX,
    SERIALIZE_JSON,
    Body,
    FrameError,
    compiled_decode_frame,
    py_decode_frame,
)

# (opaque, version, topic, queue id, system flag, born timestamp, flag, reconsume times,
#  properties text, body)
SendFields = tuple[int, int, str, int, int, int, int, int, str, Body]

# SUCCESS for one stored message, as encode_header writes it; the message id is the store host's
# hex, then the record's CommitLog offset (AppendResult.msg_id).
SEND_OK_HEADER = (
    b'{"code":0,"language":"JAVA","version":%d,"opaque":%d,"flag":1,"serializeTypeCurrentRPC":"JSON",'
    b'"extFields":{"msgId":"%s%016X","queueId":"%d","queueOffset":"%d","MSG_REGION":"DefaultRegion",'
    b'"TRACE_ON":"true"}}'
)

_STRICT_NUMBER = re.compile(r"-?[0-9]{1,18}")
_INT32 = (-(2**31), 2**31 - 1)
_BORN = (-(2**63) // 10 + 1, (2**63 - 1) // 10)  # (the compiled reader's bound, 64 bits over ten)
_NUMBERS = (("e", _INT32), ("f", _INT32), ("g", _BORN), ("h", _INT32), ("j", _INT32))


def _number(text: str, bounds: tuple[int, int]) -> int | None:
    if _STRICT_NUMBER.fullmatch(text) is None:
        return None
    v = int(text)
    return v if bounds[0] <= v <= bounds[1] else None


def py_send_fields(frame: Body, view_from: int) -> SendFields | None:
    """The Python twin of ``_codec.send_fields`` (see the module's docstring)."""
    try:
        cmd = py_decode_frame(frame)
    except FrameError:
        return None
    ext = cmd.ext_fields
    if cmd.code != RequestCode.SEND_MESSAGE_V2 or cmd.flag != 0 or cmd.serialize_type != SERIALIZE_JSON:
        return None
    if ext is None or "b" not in ext or "e" not in ext or ext.get("m") == "true":
        return None
    numbers = []
    for name, bounds in _NUMBERS:
        text = ext.get(name)
        if text is None or (text == "" and name != "e"):  # ``int(ext.get(x) or 0)``
            numbers.append(0)
            continue
        v = _number(text, bounds)
        if v is None:
            return None
        numbers.append(v)
    mv = memoryview(frame)
    hlen = int.from_bytes(mv[1:4], "big")
    rest = mv[4 + hlen :]
    if not len(rest):
        return None
    body: Body = rest if len(rest) >= view_from else bytes(rest)
    queue_id, sys_flag, born, flag, reconsume = numbers
    return (cmd.opaque, cmd.version, ext["b"], queue_id, sys_flag, born, flag, reconsume, ext.get("i", ""), body)


def py_send_ok_frame(
    version: int, opaque: int, host_hex: bytes, wrote_offset: int, queue_id: int, queue_offset: int
) -> bytes:
    """The whole frame of SUCCESS for one message stored at ``wrote_offset`` (the twin of
    ``_codec.send_ok_frame``)."""
    header = SEND_OK_HEADER % (version, opaque, host_hex, wrote_offset, queue_id, queue_offset)
    return FRAME_PREFIX.pack(4 + len(header), len(header)) + header


def flow_control_frame(version: int, opaque: int, remark: str) -> bytes:
    """The whole frame of a FLOW_CONTROL (215) answer to a send read off its frame (the quota's
    early refusal: ``BrokerTenancy.refuse_send_early``)."""
    header = orjson.dumps({
        "code": ResponseCode.FLOW_CONTROL, "language": "JAVA", "version": version, "opaque": opaque, "flag": 1,
        "serializeTypeCurrentRPC": "JSON", "remark": remark,
    })  # fmt: skip
    return FRAME_PREFIX.pack(4 + len(header), len(header)) + header


def _compiled(name: str) -> Any:
    if compiled_decode_frame is None:  # no extension, or ORBIT_PURE_PYTHON
        return None
    from data_plane.remoting import _codec

    return getattr(_codec, name)


send_fields: Callable[[Body, int], SendFields | None] = _compiled("send_fields") or py_send_fields
send_ok_frame: Callable[[int, int, bytes, int, int, int], bytes] = _compiled("send_ok_frame") or py_send_ok_frame
