"""The requests the SDK sends and the answers it reads, as pure functions (no sockets).

Each ``*_request`` returns a ``RemotingCommand`` with RocketMQ 4.x's request code and
extFields (strings on the wire); each ``parse_*`` reads a response and raises the SDK's error
for a failure code. ``client_instance`` sends them; tests feed them bytes directly.

A PULL response's body is CommitLog records back to back (``data_plane.store.message``'s
layout); ``decode_messages`` splits and decodes them.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from data_plane.remoting import bodies
from data_plane.remoting.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from data_plane.remoting.command import RemotingCommand, fill_head, json_text
from data_plane.store.compiled import RecordCodec
from data_plane.store.message import (
    FLAG_COMPRESSED,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    encode_properties,
    unpack_host,
)
from sdk import record_codec
from sdk.errors import BrokerError, for_code
from sdk.message import DEFAULT_TOPIC, Message, MessageExt, MessageQueue, SendResult, SendStatus, new_send_result
from sdk.record_codec import PYTHON, PythonRecordCodec

DEFAULT_TOPIC_QUEUE_NUMS = 4


def check(resp: RemotingCommand, addr: str = "", ok: Iterable[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
    """``resp`` when its code is one of ``ok``, else the SDK error for its code."""
    if resp.code not in tuple(ok):
        raise for_code(resp.code, resp.remark, addr)
    return resp


def _ext(resp: RemotingCommand, name: str, addr: str = "") -> str:
    v = (resp.ext_fields or {}).get(name)
    if v is None or v == "":
        raise BrokerError(f"{addr}: response code {resp.code} lacks header field {name!r}", addr=addr)
    return v


def _ext_int(resp: RemotingCommand, name: str, addr: str = "") -> int:
    v = _ext(resp, name, addr)
    try:
        return int(v)
    except ValueError:
        try:
            return int(float(v))
        except ValueError:
            raise BrokerError(f"{addr}: header field {name!r} is not a number: {v[:40]!r}", addr=addr) from None


# --- name server ----------------------------------------------------------------------------------
def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})


def parse_route_response(resp: RemotingCommand, addr: str = "") -> dict[str, Any] | None:
    """TopicRouteData, or None when the name server does not know the topic (code 17)."""
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    check(resp, addr)
    try:
        return bodies.loads_object(resp.body_bytes())
    except ValueError as e:
        raise BrokerError(f"{addr}: route body is not TopicRouteData: {e}", addr=addr) from None


# --- send -------------------------------------------------------------------------------------------
def _send_header(
    *,
    group: str,
    topic: str,
    queue_id: int,
    properties: bytes,
    born_timestamp_ms: int,
    batch: bool,
    reconsume_times: int = 0,
    max_reconsume_times: int | None = None,
) -> dict[str, str]:
    ext = {
        "a": group,
        "b": topic,
        "c": DEFAULT_TOPIC,
        "d": str(DEFAULT_TOPIC_QUEUE_NUMS),
        "e": str(queue_id),
        "f": "0",
        "g": str(born_timestamp_ms),
        "h": "0",
        "i": properties.decode(),
        "j": str(reconsume_times),
        "k": "false",
        "m": "true" if batch else "false",
    }
    if max_reconsume_times is not None:
        ext["l"] = str(max_reconsume_times)
    return ext


_QUEUE_ID_TEXT = tuple(str(q) for q in range(1024))  # "0".."1023": a send's queue id, not formatted each time
_DEFAULT_QUEUE_NUMS_TEXT = str(DEFAULT_TOPIC_QUEUE_NUMS)


def send_request(*, group: str, msg: Message, queue_id: int, unique_id: str, born_timestamp_ms: int) -> RemotingCommand:
    """SEND_MESSAGE_V2 (310): the short-named header of SendMessageRequestHeaderV2 (what
    ``_send_header`` gives for one message, built inline: the send path's)."""
    ext = {
        "a": group,
        "b": msg.topic,
        "c": DEFAULT_TOPIC,
        "d": _DEFAULT_QUEUE_NUMS_TEXT,
        "e": _QUEUE_ID_TEXT[queue_id] if 0 <= queue_id < 1024 else str(queue_id),
        "f": "0",
        "g": str(born_timestamp_ms),
        "h": "0",
        "i": msg.properties_text(unique_id),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=ext, body=msg.body)


class SendHead:
    """``send_request``'s frame head (``frame_head`` of its command), laid out from a template
    made once per producer group: the header's fixed text as pieces, the message's own fields
    filled in (``command.fill_head``, compiled when built) — no extFields dict, no command
    object. The same bytes as the command path (tests/unit/test_send_head.py). ``auth``, a
    credential's extFields text (``ClientInstance.send_connection``: a bearer token's
    ``,"Authorization":"Bearer …"``), goes at the end of the extFields, where the command path's
    signing puts those fields; the pieces with it are made once a token."""

    __slots__ = ("_auth", "_auth_plain", "_auth_tagged", "plain", "tagged")

    def __init__(self, group: str) -> None:
        t = json_text
        cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2)  # (its language and version)
        head = b'{"code":%d,"language":"%s","version":%d,"opaque":' % (cmd.code, t(cmd.language), cmd.version)
        ext = b',"flag":0,"serializeTypeCurrentRPC":"JSON","extFields":{"a":"' + t(group) + b'","b":"'
        queue = b'","c":"' + t(DEFAULT_TOPIC) + b'","d":"' + t(_DEFAULT_QUEUE_NUMS_TEXT) + b'","e":"'
        born = b'","f":"0","g":"'
        props = b'","h":"0","i":"'
        wait = t(f"{PROPERTY_WAIT_STORE_MSG_OK}\x01true\x02{PROPERTY_UNIQ_KEY}\x01")
        end = t("\x02") + b'","j":"0","k":"false","m":"false"}}'
        # values: opaque, topic, queue id, born ms, the user properties' text, [tags,] unique id
        self.plain: tuple[bytes, ...] = (head, ext, queue, born, props, wait, end)
        self.tagged: tuple[bytes, ...] = (
            head, ext, queue, born, props, t(f"{PROPERTY_TAGS}\x01"), t("\x02") + wait, end,
        )  # fmt: skip
        self._auth = b""
        self._auth_plain: tuple[bytes, ...] = self.plain
        self._auth_tagged: tuple[bytes, ...] = self.tagged

    def _with_auth(self, auth: bytes) -> None:
        """The pieces for extFields that end with ``auth``."""

        def closed_by(pieces: tuple[bytes, ...]) -> tuple[bytes, ...]:
            assert pieces[-1].endswith(b"}}")
            return (*pieces[:-1], pieces[-1][:-2] + auth + b"}}")

        self._auth_plain = closed_by(self.plain)
        self._auth_tagged = closed_by(self.tagged)
        self._auth = auth

    def frame(
        self, msg: Message, opaque: int, queue_id: int, unique_id: str, born_timestamp_ms: int, auth: bytes = b""
    ) -> bytes | None:
        """The head for ``msg`` (its body follows it), or None for a message this does not lay
        out (keys or a schedule: ``send_request``'s path)."""
        if msg.keys or msg.delay_level or msg.deliver_at_ms is not None:
            return None
        plain, tagged = self.plain, self.tagged
        if auth:
            if auth is not self._auth and auth != self._auth:
                self._with_auth(auth)
            plain, tagged = self._auth_plain, self._auth_tagged
        user = msg.user_properties_text()
        tags = msg.tags
        if tags is None:
            values: tuple[str | int, ...] = (opaque, msg.topic, queue_id, born_timestamp_ms, user, unique_id)
            return fill_head(plain, values, len(msg.body))
        values = (opaque, msg.topic, queue_id, born_timestamp_ms, user, tags, unique_id)
        return fill_head(tagged, values, len(msg.body))


def batch_body(msgs: Sequence[Message], unique_ids: Sequence[str]) -> bytes:
    """The SEND_BATCH_MESSAGE body; plain messages (no user properties, keys or schedule) are
    laid out by the compiled codec when it is in use, the rest by the Python one."""
    body = _codec.plain_batch_body(list(msgs), list(unique_ids), Message)
    return body if body is not None else py_batch_body(msgs, unique_ids)


def py_batch_body(msgs: Sequence[Message], unique_ids: Sequence[str]) -> bytes:
    """``batch_body`` by the Python codec alone (the reference the twin tests compare with)."""
    return PythonRecordCodec.plain_batch_body(msgs, unique_ids, Message)


def send_batch_request(
    *,
    group: str,
    msgs: Sequence[Message],
    queue_id: int,
    unique_ids: Sequence[str],
    born_timestamp_ms: int,
    body: bytes | None = None,
) -> RemotingCommand:
    """SEND_BATCH_MESSAGE (320): the same header with m=true; the body holds every message
    (``body``: ``batch_body(msgs, unique_ids)`` already built)."""
    ext = _send_header(
        group=group,
        topic=msgs[0].topic,
        queue_id=queue_id,
        properties=encode_properties({PROPERTY_WAIT_STORE_MSG_OK: "true"}),
        born_timestamp_ms=born_timestamp_ms,
        batch=True,
    )
    if body is None:
        body = batch_body(msgs, unique_ids)
    return RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields=ext, body=body)


_SEND_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


def parse_send_response(resp: RemotingCommand, mq: MessageQueue, msg_id: str, addr: str = "") -> SendResult:
    status = _SEND_STATUS.get(resp.code)  # type: ignore[call-overload]
    if status is None:
        raise for_code(resp.code, resp.remark, addr)
    ext = resp.ext_fields or {}
    queue_id = int(ext.get("queueId") or mq.queue_id)
    return new_send_result(
        status,
        msg_id,
        ext.get("msgId", ""),
        mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id),
        int(ext.get("queueOffset") or -1),
    )


# --- pull -----------------------------------------------------------------------------------------
class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"  # PULL_NOT_FOUND (19)
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # PULL_RETRY_IMMEDIATELY (20)
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # PULL_OFFSET_MOVED (21)


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int = 0
    messages: list[MessageExt] = field(default_factory=list)


def pull_request(
    *,
    group: str,
    mq: MessageQueue,
    offset: int,
    max_nums: int,
    subscription: str,
    sub_version: int,
    suspend_timeout_ms: int,
    commit_offset: int = 0,
    suspend: bool = True,
    expression_type: str = "TAG",
) -> RemotingCommand:
    """PULL_MESSAGE (11). The subscription always travels with the pull (flag bit 4), so the
    broker filters even before it has this client's heartbeat."""
    sys_flag = PULL_FLAG_SUBSCRIPTION
    if commit_offset > 0:
        sys_flag |= PULL_FLAG_COMMIT_OFFSET
    if suspend:
        sys_flag |= PULL_FLAG_SUSPEND
    ext = {
        "consumerGroup": group,
        "topic": mq.topic,
        "queueId": str(mq.queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_nums),
        "sysFlag": str(sys_flag),
        "commitOffset": str(max(commit_offset, 0)),
        "suspendTimeoutMillis": str(suspend_timeout_ms),
        "subscription": subscription,
        "subVersion": str(sub_version),
        "expressionType": expression_type,
    }
    return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext)


_RAW_TYPES = (bytes, memoryview)  # a tuple: ``bytes | memoryview`` makes a union object each call
_HOSTS: dict[bytes, tuple[str, int]] = {}  # 8-byte host field → (ip, port): a few distinct values
_TOPICS: dict[bytes, str] = {}


def decode_messages(
    body: bytes | memoryview, broker_name: str, *, check_crc: bool = True, codec: RecordCodec | None = None
) -> list[MessageExt]:
    """The records of a PULL body, in order, by ``codec`` (by default the one in use: the
    compiled ``_records`` when built, at about a fifth of the Python twin's cost). A record that
    is not sound raises BrokerError."""
    try:
        out: list[MessageExt]
        out, compressed = (codec or _codec).decode_records(
            body, MessageExt, broker_name, check_crc, _TOPICS, _HOSTS, unpack_host
        )
    except ValueError as e:
        raise BrokerError(str(e)) from None
    if compressed:  # stock Java producers zlib-compress bodies over 4 KiB
        for i, m in enumerate(out):
            if m.sys_flag & FLAG_COMPRESSED:
                try:
                    m.body = zlib.decompress(m.body)
                except zlib.error as e:
                    raise BrokerError(
                        f"pull body: record at byte {_record_position(out, i)} does not decompress: {e}"
                    ) from None
    return out


def _record_position(records: list[MessageExt], i: int) -> int:
    return sum(m.store_size for m in records[:i])


def py_decode_messages(body: bytes | memoryview, broker_name: str, *, check_crc: bool = True) -> list[MessageExt]:
    """``decode_messages`` by the Python codec (the reference the twin tests compare with)."""
    return decode_messages(body, broker_name, check_crc=check_crc, codec=PYTHON)


_codec: RecordCodec = record_codec.codec()


def use_compiled_decoder(enabled: bool) -> bool:
    """Switch the codec ``decode_messages`` and ``batch_body`` use (tests compare them); the
    compiled one only when it is built. Returns whether the compiled one was on before."""
    global _codec
    was = _codec is not PYTHON
    _codec = record_codec.codec() if enabled else PYTHON
    return was


def compiled_decoder_on() -> bool:
    """Whether ``decode_messages`` and ``batch_body`` use the compiled codec now."""
    return _codec is not PYTHON


def parse_pull_response(
    resp: RemotingCommand, broker_name: str, addr: str = "", *, check_crc: bool = True
) -> PullResult:
    status = _PULL_STATUS.get(resp.code)  # type: ignore[call-overload]
    if status is None:
        raise for_code(resp.code, resp.remark, addr)
    result = PullResult(
        status=status,
        next_begin_offset=_ext_int(resp, "nextBeginOffset", addr),
        min_offset=_ext_int(resp, "minOffset", addr),
        max_offset=_ext_int(resp, "maxOffset", addr),
        suggest_which_broker_id=int((resp.ext_fields or {}).get("suggestWhichBrokerId") or 0),
    )
    body = resp.body
    if status is PullStatus.FOUND and body is not None:
        # Straight from the frame (a large body is a view of it): the decoders copy each
        # message's body out, so nothing keeps the frame alive.
        raw = body if isinstance(body, _RAW_TYPES) else resp.body_bytes()
        result.messages = decode_messages(raw, broker_name, check_crc=check_crc)
    return result


# --- offsets ----------------------------------------------------------------------------------------
def query_offset_request(group: str, mq: MessageQueue) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.QUERY_CONSUMER_OFFSET,
        ext_fields={"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id)},
    )


def parse_query_offset_response(resp: RemotingCommand, addr: str = "") -> int | None:
    """The committed offset, or None when the group has none for the queue (QUERY_NOT_FOUND)."""
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    check(resp, addr)
    return _ext_int(resp, "offset", addr)


def update_offset_request(group: str, mq: MessageQueue, offset: int) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        ext_fields={
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": str(mq.queue_id),
            "commitOffset": str(offset),
        },
    )


def queue_offset_request(code: int, mq: MessageQueue) -> RemotingCommand:
    """GET_MAX_OFFSET (30) / GET_MIN_OFFSET (31)."""
    return RemotingCommand(code, ext_fields={"topic": mq.topic, "queueId": str(mq.queue_id)})


def search_offset_request(mq: MessageQueue, timestamp_ms: int) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        ext_fields={"topic": mq.topic, "queueId": str(mq.queue_id), "timestamp": str(timestamp_ms)},
    )


def parse_offset_response(resp: RemotingCommand, addr: str = "") -> int:
    check(resp, addr)
    return _ext_int(resp, "offset", addr)


# --- group membership, locks, heartbeat ----------------------------------------------------------------
def consumer_list_request(group: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": group})


def parse_consumer_list_response(resp: RemotingCommand, addr: str = "") -> list[str]:
    check(resp, addr)
    if not resp.body:
        return []
    try:
        data = bodies.loads_object(resp.body_bytes())
    except ValueError as e:
        raise BrokerError(f"{addr}: consumer list body is not JSON: {e}", addr=addr) from None
    return [str(c) for c in data.get("consumerIdList") or []]


def _mq_data(mq: MessageQueue) -> bodies.MessageQueueData:
    return {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id}


def lock_batch_request(
    group: str, client_id: str, mqs: Iterable[MessageQueue], *, unlock: bool = False
) -> RemotingCommand:
    body = bodies.dumps({"consumerGroup": group, "clientId": client_id, "mqSet": [_mq_data(q) for q in mqs]})
    code = RequestCode.UNLOCK_BATCH_MQ if unlock else RequestCode.LOCK_BATCH_MQ
    return RemotingCommand(code, body=body)


def parse_lock_batch_response(resp: RemotingCommand, addr: str = "") -> set[MessageQueue]:
    check(resp, addr)
    if not resp.body:
        return set()
    try:
        data = bodies.loads_object(resp.body_bytes())
        return {
            MessageQueue(q["topic"], q["brokerName"], q["queueId"])
            for q in (bodies.message_queue(v) for v in data.get("lockOKMQSet") or [])
        }
    except ValueError as e:
        raise BrokerError(f"{addr}: lock body is not LockBatchResponseBody: {e}", addr=addr) from None


def heartbeat_request(data: bodies.HeartbeatData) -> RemotingCommand:
    return RemotingCommand(RequestCode.HEART_BEAT, body=bodies.dumps(data))


def unregister_request(client_id: str, *, producer_group: str = "", consumer_group: str = "") -> RemotingCommand:
    ext = {"clientID": client_id}
    if producer_group:
        ext["producerGroup"] = producer_group
    if consumer_group:
        ext["consumerGroup"] = consumer_group
    return RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields=ext)


def create_topic_request(topic: str, *, queue_nums: int = 4, perm: int = 6) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC (17), an admin request (tests and tools create topics with it)."""
    return RemotingCommand(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        ext_fields={
            "topic": topic,
            "defaultTopic": DEFAULT_TOPIC,
            "readQueueNums": str(queue_nums),
            "writeQueueNums": str(queue_nums),
            "perm": str(perm),
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        },
    )
