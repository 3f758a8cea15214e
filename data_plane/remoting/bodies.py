"""JSON bodies of RocketMQ requests and responses (the Java ``RemotingSerializable`` classes),
as TypedDicts with helpers, and the binary body of SEND_BATCH_MESSAGE.

Field names are the Java classes' own, so stock clients read and write them. Decoding accepts
what Java's fastjson writes, including map keys that are not quoted strings
(``{0:"host:port"}``), which standard JSON parsers reject.
"""

from __future__ import annotations

import re
import struct
from typing import Any, NotRequired, TypedDict

import orjson

from data_plane.remoting.errors import HeaderError
from data_plane.store import layouts


class QueueData(TypedDict):
    brokerName: str
    readQueueNums: int
    writeQueueNums: int
    perm: int
    topicSynFlag: int


class BrokerData(TypedDict):
    cluster: str
    brokerName: str
    brokerAddrs: dict[str, str]  # broker id ("0" = master) → "host:port"


class TopicRouteData(TypedDict):
    orderTopicConf: NotRequired[str]
    queueDatas: list[QueueData]
    brokerDatas: list[BrokerData]
    filterServerTable: dict[str, list[str]]


class TopicConfig(TypedDict):
    topicName: str
    readQueueNums: int
    writeQueueNums: int
    perm: int
    topicFilterType: str
    topicSysFlag: int
    order: bool


class DataVersion(TypedDict):
    timestamp: int
    counter: int


class TopicConfigSerializeWrapper(TypedDict):
    topicConfigTable: dict[str, TopicConfig]
    dataVersion: DataVersion


class RegisterBrokerBody(TypedDict):
    topicConfigSerializeWrapper: TopicConfigSerializeWrapper
    filterServerList: list[str]


class SubscriptionData(TypedDict, total=False):
    classFilterMode: bool
    topic: str
    subString: str
    tagsSet: list[str]
    codeSet: list[int]
    subVersion: int
    expressionType: str


class ConsumerData(TypedDict, total=False):
    groupName: str
    consumeType: str  # CONSUME_ACTIVELY (pull) / CONSUME_PASSIVELY (push)
    messageModel: str  # CLUSTERING / BROADCASTING
    consumeFromWhere: str
    subscriptionDataSet: list[SubscriptionData]
    unitMode: bool


class ProducerData(TypedDict):
    groupName: str


class HeartbeatData(TypedDict, total=False):
    clientID: str
    producerDataSet: list[ProducerData]
    consumerDataSet: list[ConsumerData]


class MessageQueueData(TypedDict):
    topic: str
    brokerName: str
    queueId: int


def topic_config(
    name: str, read: int, write: int, perm: int = 6, order: bool = False, sys_flag: int = 0
) -> TopicConfig:
    return {
        "topicName": name,
        "readQueueNums": read,
        "writeQueueNums": write,
        "perm": perm,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": sys_flag,
        "order": order,
    }


# --- lenient JSON ----------------------------------------------------------------------------
# A string literal (kept as it is) or a bare integer key (quoted).
_BARE_KEY = re.compile(rb'("[^"\\]*(?:\\.[^"\\]*)*")|([{,]\s*)(-?\d+)(\s*:)', re.DOTALL)


def _quote_key(m: re.Match[bytes]) -> bytes:
    if m.group(1) is not None:
        return m.group(1)
    return m.group(2) + b'"' + m.group(3) + b'"' + m.group(4)


def loads(body: bytes | bytearray | memoryview | None) -> Any:
    """Parse a JSON body as fastjson writes it. Raises HeaderError (answered as a clear error)."""
    if not body:
        raise HeaderError("the request has no body")
    raw = bytes(body)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(_BARE_KEY.sub(_quote_key, raw))
    except orjson.JSONDecodeError as e:
        raise HeaderError(f"the body is not JSON: {e}") from None


def loads_object(body: bytes | bytearray | memoryview | None) -> dict[str, Any]:
    v = loads(body)
    if not isinstance(v, dict):
        raise HeaderError("the body is not a JSON object")
    return v


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def message_queue(v: Any) -> MessageQueueData:
    """Validate one ``{topic, brokerName, queueId}`` object."""
    if not isinstance(v, dict):
        raise HeaderError("a message queue is not an object")
    try:
        return {"topic": str(v["topic"]), "brokerName": str(v["brokerName"]), "queueId": int(v["queueId"])}
    except (KeyError, TypeError, ValueError) as e:
        raise HeaderError(f"a message queue lacks a field or has a bad one: {e}") from None


# --- SEND_BATCH_MESSAGE body -------------------------------------------------------------------
# Each message of a batch (MessageDecoder.encodeMessage), big-endian:
#
#   ┌─────────────┬────────────┬──────────┬──────────┬─────────────┬──────┬───────────────────┬────────────┐
#   │ total size  │ magic code │ body CRC │ flag     │ body length │ body │ properties length │ properties │
#   │ 4           │ 4          │ 4        │ 4        │ 4           │ n    │ 2                 │ m          │
#   └─────────────┴────────────┴──────────┴──────────┴─────────────┴──────┴───────────────────┴────────────┘
BATCH_ITEM_HEAD = layouts.BATCH_ITEM  # (the one definition, shared with the C modules)
assert BATCH_ITEM_HEAD.size == 20
_PROPS_LEN = struct.Struct(">H")


def encode_batch_item(body: bytes, flag: int, properties: bytes) -> bytes:
    total = 20 + len(body) + 2 + len(properties)
    return b"".join(
        (BATCH_ITEM_HEAD.pack(total, 0, 0, flag, len(body)), body, _PROPS_LEN.pack(len(properties)), properties)
    )


MAX_BATCH_MESSAGES = 100_000  # messages in one SEND_BATCH_MESSAGE body


def decode_batch(body: bytes | memoryview, max_messages: int = MAX_BATCH_MESSAGES) -> list[tuple[int, bytes, bytes]]:
    """(flag, body, properties bytes) of each message of a batch body. Raises HeaderError."""
    mv = memoryview(body)
    out: list[tuple[int, bytes, bytes]] = []
    pos = 0
    n = len(mv)
    while pos < n:
        if n - pos < 22:
            raise HeaderError(f"batch body truncated at byte {pos}")
        total, _magic, _crc, flag, body_len = BATCH_ITEM_HEAD.unpack_from(mv, pos)
        if total < 22 or pos + total > n or body_len < 0 or 20 + body_len + 2 > total:
            raise HeaderError(f"batch message at byte {pos} has a bad size")
        b = bytes(mv[pos + 20 : pos + 20 + body_len])
        (plen,) = _PROPS_LEN.unpack_from(mv, pos + 20 + body_len)
        if 20 + body_len + 2 + plen != total:
            raise HeaderError(f"batch message at byte {pos}: sizes do not add up")
        props = bytes(mv[pos + 22 + body_len : pos + total])
        out.append((flag, b, props))
        if len(out) > max_messages:
            raise HeaderError(f"a batch holds more than {max_messages} messages")
        pos += total
    if not out:
        raise HeaderError("the batch is empty")
    return out
