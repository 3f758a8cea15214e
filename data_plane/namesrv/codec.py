"""Name server bodies on the wire: reading RegisterBrokerBody, writing answers as fastjson does.

RegisterBrokerBody comes in two forms, chosen by the request's ``compressed`` header field:

* JSON: ``{"topicConfigSerializeWrapper": {"topicConfigTable": {name: TopicConfig},
  "dataVersion": {"timestamp", "counter"}}, "filterServerList": [...]}``; an empty body is an
  empty table with data version (0, 0).
* compressed: zlib (Java's ``DeflaterOutputStream``) over, all integers big-endian int32::

      ┌────────┬──────────────────┬───────┬─────────────────────────────────┬────────┬──────────────────┐
      │ len    │ dataVersion JSON │ count │ count x { len │ "name r w perm   │ len    │ filterServerList │
      │        │                  │       │   filterType [attributes]" }    │        │ JSON             │
      └────────┴──────────────────┴───────┴─────────────────────────────────┴────────┴──────────────────┘

Answers are written byte for byte as the Java name server writes them: fields in alphabetical
order and BrokerData's ``brokerAddrs`` with bare numeric keys (``{0:"host:port"}``). Clients
depend on that: the Go client reads a broker id by parsing the text before the ``:``.

Malformed input raises ``HeaderError``, which the connection answers with its message.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import orjson

from data_plane.namesrv.route_info import ClusterInfo, DataVersion
from data_plane.remoting.bodies import BrokerData, TopicConfig, TopicRouteData, loads_object, topic_config
from data_plane.remoting.errors import HeaderError

MAX_TOPIC_LENGTH = 512  # %RETRY%<group> names run longer than the 127 allowed for user topics
MAX_QUEUE_NUMS = 65_536
MAX_INFLATED_BYTES = 64 * 1024 * 1024  # a compressed body may not inflate past this
_INT32 = struct.Struct(">i")
_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


# --- RegisterBrokerBody -------------------------------------------------------------------------
def parse_register_body(body: bytes | None, *, compressed: bool = False) -> tuple[list[TopicConfig], DataVersion]:
    """The topic configs and data version of a REGISTER_BROKER body."""
    if not body:
        return [], (0, 0)
    if compressed:
        return _parse_compressed(body)
    doc = loads_object(body)
    wrapper = doc.get("topicConfigSerializeWrapper")
    if wrapper is None:
        return [], (0, 0)
    if not isinstance(wrapper, dict):
        raise HeaderError("topicConfigSerializeWrapper is not an object")
    version = _data_version(wrapper.get("dataVersion"))
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise HeaderError("topicConfigTable is not an object")
    return [_topic_config(str(key), value) for key, value in table.items()], version


def _data_version(v: Any) -> DataVersion:
    if not isinstance(v, dict):
        raise HeaderError("dataVersion is missing or not an object")
    return _int(v, "timestamp", "dataVersion"), _int(v, "counter", "dataVersion")


def _int(
    doc: dict[str, Any], name: str, where: str, default: int | None = None, lo: int = -(2**63), hi: int = 2**63 - 1
) -> int:
    v = doc.get(name)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise HeaderError(f"{where}: '{name}' is missing or not a number")
    try:
        n = int(v)
    except ValueError:
        raise HeaderError(f"{where}: '{name}' is not a number: {str(v)[:40]!r}") from None
    if not lo <= n <= hi:
        raise HeaderError(f"{where}: '{name}' = {n} is outside [{lo}, {hi}]")
    return n


def _topic_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise HeaderError("a topic config has no topic name")
    if len(name) > MAX_TOPIC_LENGTH:
        raise HeaderError(f"topic name {name[:40]!r}… is longer than {MAX_TOPIC_LENGTH} characters")
    return name


def _topic_config(key: str, v: Any) -> TopicConfig:
    """One TopicConfig object; absent fields take Java's defaults (16 queues, perm 6)."""
    if not isinstance(v, dict):
        raise HeaderError(f"topic config {key[:40]!r} is not an object")
    name = _topic_name(v.get("topicName", key))
    where = f"topic config {name[:40]!r}"
    order = v.get("order", False)
    filter_type = v.get("topicFilterType", "SINGLE_TAG")
    if not isinstance(order, bool):
        raise HeaderError(f"{where}: 'order' is not a boolean")
    if filter_type not in _FILTER_TYPES:
        raise HeaderError(f"{where}: 'topicFilterType' is not one of {', '.join(_FILTER_TYPES)}")
    config = topic_config(
        name,
        _int(v, "readQueueNums", where, 16, 0, MAX_QUEUE_NUMS),
        _int(v, "writeQueueNums", where, 16, 0, MAX_QUEUE_NUMS),
        _int(v, "perm", where, 6, 0, 0xF),
        order,
        _int(v, "topicSysFlag", where, 0, 0, 2**31 - 1),
    )
    config["topicFilterType"] = filter_type
    return config


def _parse_compressed(body: bytes) -> tuple[list[TopicConfig], DataVersion]:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(body, MAX_INFLATED_BYTES)
    except zlib.error as e:
        raise HeaderError(f"the compressed register body does not inflate: {e}") from None
    if inflater.unconsumed_tail:
        raise HeaderError(f"the compressed register body inflates past {MAX_INFLATED_BYTES} bytes")
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        if len(raw) - pos < 4:
            raise HeaderError(f"the compressed register body is truncated at byte {pos}")
        (n,) = _INT32.unpack_from(raw, pos)
        pos += 4
        if n < 0 or n > len(raw) - pos:
            raise HeaderError(f"the compressed register body has a bad length {n} at byte {pos - 4}")
        pos += n
        return raw[pos - n : pos]

    version = _data_version(loads_object(chunk()))
    if len(raw) - pos < 4:
        raise HeaderError("the compressed register body has no topic count")
    (count,) = _INT32.unpack_from(raw, pos)
    pos += 4
    if count < 0 or count * 4 > len(raw) - pos:
        raise HeaderError(f"the compressed register body announces {count} topics it does not hold")
    configs = [_topic_config_line(chunk()) for _ in range(count)]
    return configs, version


def _topic_config_line(raw: bytes) -> TopicConfig:
    """``"name read write perm filterType [attributes JSON]"`` (TopicConfig.encode)."""
    try:
        parts = raw.decode().split(" ")
    except UnicodeDecodeError:
        raise HeaderError("a compressed topic config is not UTF-8") from None
    if len(parts) < 5:
        raise HeaderError(f"a compressed topic config has {len(parts)} fields, not 5: {raw[:60]!r}")
    name, read, write, perm, filter_type = parts[:5]
    doc = {"readQueueNums": read, "writeQueueNums": write, "perm": perm, "topicFilterType": filter_type}
    return _topic_config(name, doc)


# --- answers --------------------------------------------------------------------------------------
def _broker_data(bd: BrokerData) -> bytes:
    addrs = b",".join(
        b"%d:%b" % (int(i), orjson.dumps(a)) for i, a in sorted(bd["brokerAddrs"].items(), key=lambda kv: int(kv[0]))
    )
    return b'{"brokerAddrs":{%b},"brokerName":%b,"cluster":%b}' % (
        addrs,
        orjson.dumps(bd["brokerName"]),
        orjson.dumps(bd["cluster"]),
    )


def encode_route(route: TopicRouteData) -> bytes:
    """TopicRouteData, as the body of GET_ROUTEINFO_BY_TOPIC's answer."""
    order = route.get("orderTopicConf")
    return b'{"brokerDatas":[%b],"filterServerTable":%b,%b"queueDatas":%b}' % (
        b",".join(_broker_data(bd) for bd in route["brokerDatas"]),
        orjson.dumps(route["filterServerTable"], option=orjson.OPT_SORT_KEYS),
        b"" if order is None else b'"orderTopicConf":%b,' % orjson.dumps(order),
        orjson.dumps(route["queueDatas"], option=orjson.OPT_SORT_KEYS),
    )


def encode_cluster_info(info: ClusterInfo) -> bytes:
    """ClusterInfo, as the body of GET_BROKER_CLUSTER_INFO's answer."""
    table = b",".join(b"%b:%b" % (orjson.dumps(name), _broker_data(bd)) for name, bd in info["brokerAddrTable"].items())
    return b'{"brokerAddrTable":{%b},"clusterAddrTable":%b}' % (
        table,
        orjson.dumps(info["clusterAddrTable"], option=orjson.OPT_SORT_KEYS),
    )


def encode_topic_list(topics: list[str]) -> bytes:
    """TopicList, as the body of GET_ALL_TOPIC_LIST_FROM_NAMESERVER's answer."""
    return orjson.dumps({"topicList": topics})
