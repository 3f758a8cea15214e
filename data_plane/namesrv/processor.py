"""NamesrvProcessor: the name server's request handlers (RocketMQ 4.x DefaultRequestProcessor).

    REGISTER_BROKER (103)        brokerName, brokerAddr, clusterName, haServerAddr, brokerId
                                 [, compressed, bodyCrc32]; body RegisterBrokerBody
                                 → ext masterAddr, haServerAddr (a slave whose master is live)
    UNREGISTER_BROKER (104)      brokerName, brokerAddr, clusterName, brokerId
    GET_ROUTEINFO_BY_TOPIC (105) topic → TopicRouteData, or TOPIC_NOT_EXIST (17)
    GET_BROKER_CLUSTER_INFO (106)          → ClusterInfo
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) → {"topicList": [...]}
    DELETE_TOPIC_IN_NAMESRV (216) topic

A missing or malformed header field or body raises ``HeaderError``: the connection answers
SYSTEM_ERROR with a remark naming the field and stays open. Addresses must be ``host:port``.
Each connection that registers a broker gets an id (kept in ``connection.attrs``), so the broker
goes at once when that connection closes.
"""

from __future__ import annotations

import itertools
import logging
import zlib

from data_plane.namesrv.codec import encode_cluster_info, encode_route, encode_topic_list, parse_register_body
from data_plane.namesrv.route_info import RouteInfoManager, RouteLimitError
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import HeaderError
from data_plane.remoting.headers import field_bool, field_int, field_str
from data_plane.remoting.server import Processors

log = logging.getLogger(__name__)

CONN_ID_ATTR = "namesrv.conn_id"
MAX_NAME_LENGTH = 255  # broker and cluster names
MAX_ADDR_LENGTH = 300


def check_addr(value: str, name: str) -> str:
    """``value`` if it is ``host:port`` (port 1-65535, no spaces), else HeaderError naming the field."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise HeaderError(f"header field '{name}' is not host:port: {value[:60]!r}")
    if any(c.isspace() for c in host):
        raise HeaderError(f"header field '{name}' has spaces in its host: {value[:60]!r}")
    return value


def _name(cmd: RemotingCommand, field: str) -> str:
    return field_str(cmd.ext_fields, field, max_length=MAX_NAME_LENGTH)


def _addr(cmd: RemotingCommand, field: str) -> str:
    return check_addr(field_str(cmd.ext_fields, field, max_length=MAX_ADDR_LENGTH), field)


class NamesrvProcessor:
    def __init__(self, route_info: RouteInfoManager, *, tenancy: bool = False) -> None:
        """``tenancy``: a multi-tenant cluster's name server, whose guard (guard.py) checks every
        request first — the topic list is for operators and brokers only, so it names every
        topic, tenants' included (tenants list theirs through the control plane's API) — and
        DELETE_TOPIC_IN_NAMESRV is refused (the reconciler deletes on the brokers, whose next
        registration drops the route)."""
        self.route_info = route_info
        self.tenancy = tenancy
        self.connections: dict[int, Connection] = {}  # connections that registered a broker, by id
        self._ids = itertools.count(1)

    def register_on(self, processors: Processors) -> None:
        processors.register(RequestCode.REGISTER_BROKER, self.register_broker)
        processors.register(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        processors.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_route_info)
        processors.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.get_cluster_info)
        processors.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.get_all_topics)
        processors.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic)

    # --- connections ------------------------------------------------------------------------------
    def conn_id(self, conn: Connection) -> int:
        cid = conn.attrs.get(CONN_ID_ATTR)
        if not isinstance(cid, int):
            cid = conn.attrs[CONN_ID_ATTR] = next(self._ids)
            self.connections[cid] = conn
        return cid

    def connection_closed(self, conn: Connection) -> None:
        cid = conn.attrs.get(CONN_ID_ATTR)
        if isinstance(cid, int):
            self.connections.pop(cid, None)
            self.route_info.on_connection_closed(cid)

    # --- handlers -----------------------------------------------------------------------------------
    def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        broker_name = _name(cmd, "brokerName")
        broker_addr = _addr(cmd, "brokerAddr")
        cluster = _name(cmd, "clusterName")
        ha_addr = _addr(cmd, "haServerAddr")
        broker_id = field_int(ext, "brokerId", lo=0)
        compressed = field_bool(ext, "compressed")
        crc = field_int(ext, "bodyCrc32", 0, lo=-(2**31), hi=2**31 - 1)
        body = cmd.body_bytes()
        if crc != 0 and zlib.crc32(body) & 0x7FFFFFFF != crc:  # UtilAll.crc32
            return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        configs, version = parse_register_body(body, compressed=compressed)
        try:
            result = self.route_info.register_broker(
                cluster, broker_addr, broker_name, broker_id, ha_addr, configs, version, self.conn_id(conn)
            )
        except RouteLimitError as e:
            log.warning("registration of %s (%s) refused: %s", broker_addr, broker_name, e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        answer: dict[str, str] = {}
        if result.master_addr is not None:
            answer["masterAddr"] = result.master_addr
        if result.ha_server_addr is not None:
            answer["haServerAddr"] = result.ha_server_addr
        return cmd.response(ResponseCode.SUCCESS, ext_fields=answer)

    def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        broker_name = _name(cmd, "brokerName")
        broker_addr = _addr(cmd, "brokerAddr")
        cluster = _name(cmd, "clusterName")
        broker_id = field_int(cmd.ext_fields, "brokerId", lo=0)
        self.route_info.unregister_broker(cluster, broker_addr, broker_name, broker_id)
        return cmd.response(ResponseCode.SUCCESS)

    def get_route_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = field_str(cmd.ext_fields, "topic")
        route = self.route_info.pick_route(topic)
        if route is None:
            remark = f"No topic route info in name server for the topic: {topic}"
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, remark)
        return cmd.response(ResponseCode.SUCCESS, body=encode_route(route))

    def get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=encode_cluster_info(self.route_info.cluster_info()))

    def get_all_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topics = self.route_info.all_topics()
        return cmd.response(ResponseCode.SUCCESS, body=encode_topic_list(topics))

    def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if self.tenancy:
            return cmd.response(
                ResponseCode.NO_PERMISSION, "topics are deleted through the control plane in a multi-tenant cluster"
            )
        topic = field_str(cmd.ext_fields, "topic")
        if self.route_info.delete_topic(topic):
            log.info("topic %s deleted", topic)
        return cmd.response(ResponseCode.SUCCESS)
