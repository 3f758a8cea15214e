"""``apache.rocketmq.v2.MessagingService`` served by a broker for its own queues (RocketMQ 5's
"local" proxy mode): every call is authenticated from its metadata, checked against the tenant's
grants, then done with the broker's own machinery (the send handler, the POP lease book, the
transaction service), so quotas, metering, telemetry and replication apply as on the remoting path.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import grpc
from google.protobuf.message import DecodeError

from data_plane.auth.errors import AuthError, UnknownKeyIdError
from data_plane.auth.principal import Principal
from data_plane.auth.request_access import PUBLISH, SUBSCRIBE
from data_plane.broker.pop import Delivery, PopError, TagFilter
from data_plane.broker.pull import parse_tag_expression
from data_plane.broker.recall import parse_recall_handle, recall_handle
from data_plane.broker.send_back import copy_properties
from data_plane.broker.transaction import RMQ_SYS_TRANS_HALF_TOPIC
from data_plane.filter.sql92 import SqlParseError, compile_sql92
from data_plane.http2.grpc_server import INTERNAL, CallError, Framed, framed
from data_plane.proxy.answers import ack_ok, send_ok
from data_plane.proxy.connection import GrpcConnection
from data_plane.proxy.messages import (
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_TIMER_DELIVER_MS,
    SYSTEM_PROPERTIES,
    MessageRefused,
    resource_of,
    to_message,
    to_properties,
)
from data_plane.proxy.unsupported import Unsupported
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc
from data_plane.proxy.v2_codec import COMPILED as V2_CODEC
from data_plane.proxy.v2_codec import PlainBatch
from data_plane.remoting.bodies import BATCH_ITEM_HEAD, encode_batch_item
from data_plane.remoting.codes import PERM_READ, PERM_WRITE, RequestCode, ResponseCode
from data_plane.remoting.command import SERIALIZE_ROCKETMQ, RemotingCommand
from data_plane.store.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
    decode_record,
    encode_message_id,
    encode_properties,
)
from data_plane.store.status import PutMessageStatus
from data_plane.tenancy.namespace import NAME_RE, dlq_topic, parse_wire_name

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker

log = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_INVISIBLE_MS: Final = 30_000
MIN_INVISIBLE_MS: Final = 1_000
MAX_INVISIBLE_MS: Final = 12 * 3600 * 1000
MAX_POLL_MS: Final = 30_000
MAX_BATCH_MESSAGES: Final = 64
SIGNATURE_SKEW_S: Final = 900.0
# The retry schedule push consumers follow between attempts (RocketMQ's 4.x delay ladder, cut).
RETRY_BACKOFF_S: Final = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600)
ALL_TYPES: Final = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)

_CODES: Final = {
    ResponseCode.SUCCESS: pb.OK,
    ResponseCode.FLOW_CONTROL: pb.TOO_MANY_REQUESTS,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
    ResponseCode.SERVICE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
}
_POP_CODES: Final = {
    "handle": pb.INVALID_RECEIPT_HANDLE,
    "not_master": pb.HA_NOT_AVAILABLE,
    "store": pb.INTERNAL_ERROR,
    "replication": pb.SLAVE_PERSISTENCE_TIMEOUT,
    "leases": pb.TOO_MANY_REQUESTS,
}


@dataclass(slots=True)
class Prepared:
    """A v2 message checked and turned into what the store takes."""

    wire: str
    props: dict[str, str]
    mtype: int
    born_ms: int
    body: bytes

    @property
    def batchable(self) -> bool:
        return self.mtype == pb.NORMAL


_RECEIVED_OK: Final = framed(rpc.ReceiveMessageResponse(status=pb.Status(code=pb.OK, message="OK")).SerializeToString())


def _send_answer(status: pb.Status) -> rpc.SendMessageResponse:
    return rpc.SendMessageResponse(status=status)


def _parse_send(payload: bytes) -> rpc.SendMessageRequest:
    try:
        return rpc.SendMessageRequest.FromString(payload)
    except DecodeError:
        raise CallError(INTERNAL, "the request is not a valid SendMessageRequest") from None


def _stored(ids: list[str], first: int) -> bytes:
    """The all-OK answer to messages stored in order from queue offset ``first``."""
    return send_ok(list(zip(ids, range(first, first + len(ids)), strict=True)))


def _sent(entries: list[rpc.SendResultEntry] | bytes) -> rpc.SendMessageResponse | bytes:
    """The answer to a SendMessage: ``entries`` (already the answer when they are bytes), with
    the call's status: OK, the one failure, or MULTIPLE_RESULTS when some messages failed."""
    if isinstance(entries, bytes):
        return entries
    bad = [e.status for e in entries if e.status.code != pb.OK]
    if not bad:
        status = ok()
    elif len(bad) == len(entries) or len(entries) == 1:
        status = bad[0]
    else:
        status = pb.Status(code=pb.MULTIPLE_RESULTS, message=f"{len(bad)} of {len(entries)} messages failed")
    return rpc.SendMessageResponse(status=status, entries=entries)


class Refused(Exception):
    """Answer the call with this v2 status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> pb.Status:
        return pb.Status(code=self.code, message=self.message)  # type: ignore[arg-type]


def ok() -> pb.Status:
    return pb.Status(code=pb.OK, message="OK")


class Caller:
    """Who is calling, and the namespace their names are in."""

    __slots__ = ("client_id", "namespace", "peer", "principal")

    def __init__(self, principal: Principal | None, namespace: str, client_id: str, peer: str) -> None:
        self.principal = principal
        self.namespace = namespace
        self.client_id = client_id
        self.peer = peer


def _peer_address(context: Context) -> str:
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest
    if kind == "ipv6":
        return "127.0.0.1:0" if rest.startswith("[::1]") else "0.0.0.0:0"
    return "127.0.0.1:0"


class MessagingService(Unsupported, service_pb2_grpc.MessagingServiceServicer):
    raw_requests: Final = frozenset({"SendMessage"})  # (handed over as bytes: data_plane.http2.grpc_server)

    def __init__(self, broker: Broker, *, advertised: tuple[str, int]) -> None:
        self.broker = broker
        self.advertised = advertised
        self.connections: dict[str, GrpcConnection] = {}
        self.max_clients = 10_000
        self.refused = 0

    # --- who is calling ---------------------------------------------------------------------------
    async def _caller(self, context: Context, nbytes_in: int = 0) -> Caller:
        """Who is calling (authenticated when authentication is on); the call is metered for
        their tenant once, with the bytes it brings (message bodies), as a remoting request is."""
        caller = await self._authenticate(context)
        tenancy = self.broker.tenancy
        if caller.principal is not None and caller.principal.role == "tenant" and tenancy is not None:
            tenancy.meter.record_request(caller.principal.tenant, nbytes_in, 0)
        return caller

    async def _authenticate(self, context: Context) -> Caller:
        md: dict[str, str] = {}
        for item in context.invocation_metadata() or ():
            k, v = item[0], item[1]
            if isinstance(v, str) and len(v) <= 4096:
                md[k] = v
        namespace = md.get("x-mq-namespace", "")
        client_id = md.get("x-mq-client-id", "")[:256]
        peer = _peer_address(context)
        tenancy = self.broker.tenancy
        if tenancy is None or not tenancy.enabled:
            return Caller(None, namespace, client_id, peer)
        auth = tenancy.auth
        authorization = md.get("authorization", "")
        date_time = md.get("x-mq-date-time", "")
        try:
            try:
                principal = auth.authenticate_headers(authorization, date_time, max_skew_s=SIGNATURE_SKEW_S)
            except UnknownKeyIdError as e:
                if auth.jwks is None or not auth.jwks.unknown_kid_refresh_allowed():
                    raise
                await auth.jwks.refresh_for_unknown_kid(e.kid)
                principal = auth.authenticate_headers(authorization, date_time, max_skew_s=SIGNATURE_SKEW_S)
        except AuthError as e:
            auth.denied += 1
            tenancy.refusals("credentials", "refused a gRPC call from %s: %s", peer, e.remark)
            raise Refused(pb.UNAUTHORIZED, e.remark) from None
        if principal.role == "tenant":
            if principal.tenant in tenancy.suspended:
                raise Refused(pb.FORBIDDEN, f"tenant {principal.tenant} is suspended")
            if namespace and namespace != principal.tenant:
                auth.denied += 1
                remark = f"namespace {namespace!r} is not the credential's tenant's"
                tenancy.refusals("permission", "refused a gRPC call from %s: %s", peer, remark)
                raise Refused(pb.FORBIDDEN, remark)
        return Caller(principal, namespace, client_id, peer)

    def _wire(self, caller: Caller, res: pb.Resource, kind: str) -> str:
        ns = res.resource_namespace or caller.namespace
        name = res.name
        if not NAME_RE.fullmatch(name):
            code = pb.ILLEGAL_TOPIC if kind == "topic" else pb.ILLEGAL_CONSUMER_GROUP
            raise Refused(code, f"{kind} name {name[:64]!r} is not 1 to 64 letters, digits, '_' or '-'")
        return f"{ns}%{name}" if ns else name

    def _allow(self, caller: Caller, kind: str, wire: str, action: str) -> None:
        tenancy = self.broker.tenancy
        if caller.principal is None or tenancy is None:
            return
        d = tenancy.auth.check_resource(caller.principal, kind, wire, action)
        if d is not None:
            tenancy.auth.denied += 1
            tenancy.refusals("permission", "refused a gRPC call from %s: %s", caller.peer, d.remark)
            raise Refused(pb.FORBIDDEN, d.remark)

    @staticmethod
    def _key(caller: Caller) -> str:
        """A client's connection key: its id under the identity that proved it (so a client id
        another tenant names reaches nothing of this one's, its check-backs included)."""
        who = caller.principal.subject if caller.principal is not None else ""
        return f"{who}\x00{caller.client_id or caller.peer}"

    def _connection(self, caller: Caller) -> GrpcConnection:
        key = self._key(caller)
        conn = self.connections.get(key)
        if conn is None:
            if len(self.connections) >= self.max_clients:
                self._expire_idle()
                if len(self.connections) >= self.max_clients:
                    raise Refused(pb.TOO_MANY_REQUESTS, "this broker holds too many gRPC clients")
            conn = self.connections[key] = GrpcConnection(key, caller.peer)
        conn.seen = time.monotonic()
        return conn

    def _expire_idle(self, idle_s: float = 120.0) -> None:
        now = time.monotonic()
        for key, conn in list(self.connections.items()):
            if now - conn.seen > idle_s and conn.telemetry is None:
                self._drop(key)

    def _drop(self, key: str) -> None:
        conn = self.connections.pop(key, None)
        if conn is not None:
            conn.closed = True
            self.broker._connection_closed(conn)  # type: ignore[arg-type]

    async def _guard(self, answer: Callable[[pb.Status], Any], work: Awaitable[Any]) -> Any:
        try:
            return await work
        except Refused as e:
            self.refused += 1
            return answer(e.status())
        except PopError as e:
            self.refused += 1
            return answer(pb.Status(code=_POP_CODES.get(e.code, pb.INTERNAL_ERROR), message=str(e)))

    # --- routes and membership ------------------------------------------------------------------
    def _queues(self, wire: str, perm_needed: int = 0) -> list[pb.MessageQueue]:
        tc = self.broker.topics.get(wire)
        if tc is None:
            raise Refused(pb.TOPIC_NOT_FOUND, f"topic {wire!r} does not exist")
        perm = int(tc["perm"])
        host, port = self.advertised
        broker = pb.Broker(
            name=self.broker.config.broker_name,
            id=0,
            endpoints=pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=port)]),
        )
        res = resource_of(wire)
        n = max(int(tc["readQueueNums"]), int(tc["writeQueueNums"]))
        out = []
        for qid in range(n):
            p = 0
            if perm & PERM_READ and qid < int(tc["readQueueNums"]):
                p |= 1
            if perm & PERM_WRITE and qid < int(tc["writeQueueNums"]):
                p |= 2
            permission = {0: pb.NONE, 1: pb.READ, 2: pb.WRITE, 3: pb.READ_WRITE}[p]
            out.append(pb.MessageQueue(topic=res, id=qid, permission=permission, broker=broker,
                                       accept_message_types=ALL_TYPES))  # fmt: skip
        return out

    async def QueryRoute(self, request: rpc.QueryRouteRequest, context: Context) -> Any:
        async def work() -> rpc.QueryRouteResponse:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            self._allow(caller, "topic", wire, "namespace")
            return rpc.QueryRouteResponse(status=ok(), message_queues=self._queues(wire))

        return await self._guard(lambda s: rpc.QueryRouteResponse(status=s), work())

    async def QueryAssignment(self, request: rpc.QueryAssignmentRequest, context: Context) -> Any:
        async def work() -> rpc.QueryAssignmentResponse:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            group = self._wire(caller, request.group, "group")
            self._allow(caller, "group", group, SUBSCRIBE)
            self._allow(caller, "topic", wire, SUBSCRIBE)
            readable = [q for q in self._queues(wire) if q.permission in (pb.READ, pb.READ_WRITE)]
            return rpc.QueryAssignmentResponse(
                status=ok(), assignments=[pb.Assignment(message_queue=q) for q in readable]
            )

        return await self._guard(lambda s: rpc.QueryAssignmentResponse(status=s), work())

    async def Heartbeat(self, request: rpc.HeartbeatRequest, context: Context) -> Any:
        async def work() -> rpc.HeartbeatResponse:
            caller = await self._caller(context)
            conn = self._connection(caller)
            if request.HasField("group") and request.group.name:
                group = self._wire(caller, request.group, "group")
                self._allow(caller, "group", group, SUBSCRIBE)
                self._check_not_v4_group(group)
                conn.groups.add(group)
            return rpc.HeartbeatResponse(status=ok())

        return await self._guard(lambda s: rpc.HeartbeatResponse(status=s), work())

    async def NotifyClientTermination(self, request: rpc.NotifyClientTerminationRequest, context: Context) -> Any:
        async def work() -> rpc.NotifyClientTerminationResponse:
            caller = await self._caller(context)
            self._drop(self._key(caller))
            return rpc.NotifyClientTerminationResponse(status=ok())

        return await self._guard(lambda s: rpc.NotifyClientTerminationResponse(status=s), work())

    def _check_not_v4_group(self, group: str) -> None:
        info = self.broker.clients.find_group(group)
        if info is not None and info.members:
            raise Refused(
                pb.FORBIDDEN,
                f"group {group!r} is consumed by RocketMQ 4.x push consumers on this broker: a group "
                "consumes either by pull (4.x) or by lease (5.x), not both",
            )

    # --- sending ------------------------------------------------------------------------------------
    async def SendMessage(self, request: rpc.SendMessageRequest | bytes, context: Context) -> Any:
        """``request`` comes as its bytes from Orbit's gRPC server (``raw_requests``): plain
        messages of one topic are read straight into a batch body (``v2_codec``), anything
        else is parsed and each message judged on its own."""
        if isinstance(request, bytes):
            store = self.broker.store
            plain = None
            if V2_CODEC is not None and store is not None:
                max_body = store.config.max_message_size_bytes
                plain = V2_CODEC.plain_batch(request, MAX_BATCH_MESSAGES, max_body, int(time.time() * 1000))
            if plain is not None:
                return await self._guard(_send_answer, self._send_plain(PlainBatch._make(plain), request, context))
            request = _parse_send(request)
        return await self._guard(_send_answer, self._send_request(request, context))

    async def _send_request(
        self, request: rpc.SendMessageRequest, context: Context, caller: Caller | None = None
    ) -> rpc.SendMessageResponse | bytes:
        if caller is None:
            tenancy = self.broker.tenancy
            metered = tenancy is not None and tenancy.enabled  # (the bodies' bytes are counted for a tenant)
            caller = await self._caller(context, sum(len(m.body) for m in request.messages) if metered else 0)
        if not request.messages:
            raise Refused(pb.BAD_REQUEST, "the request holds no message")
        if len(request.messages) > MAX_BATCH_MESSAGES:
            raise Refused(pb.BAD_REQUEST, f"at most {MAX_BATCH_MESSAGES} messages a call")
        conn = self._connection(caller)
        topics: dict[tuple[str, str], str] = {}  # (namespace, name) -> wire name, checked once a call
        now_ms = int(time.time() * 1000)
        prepared = [self._prepare(caller, m, topics, now_ms) for m in request.messages]
        ready = [p for p in prepared if isinstance(p, Prepared)]
        if len(ready) == len(prepared) > 1 and all(p.batchable and p.wire == ready[0].wire for p in ready):
            items = b"".join([encode_batch_item(bytes(p.body), 0, encode_properties(p.props)) for p in ready])
            ids = [p.props[PROPERTY_UNIQ_KEY] for p in ready]
            return _sent(await self._send_batch(conn, ready[0].wire, ready[0].born_ms, items, ids))
        return _sent([p if isinstance(p, rpc.SendResultEntry) else await self._send_one(conn, p) for p in prepared])

    async def _send_plain(self, plain: PlainBatch, payload: bytes, context: Context) -> rpc.SendMessageResponse | bytes:
        """Plain messages of one topic, read into a batch body (``v2_codec``): the caller, the
        topic and the right to publish checked once, then stored as one batch."""
        tenancy = self.broker.tenancy
        metered = tenancy is not None and tenancy.enabled
        caller = await self._caller(context, plain.body_bytes if metered else 0)
        try:
            wire = self._wire(caller, pb.Resource(resource_namespace=plain.namespace, name=plain.name), "topic")
            self._allow(caller, "topic", wire, PUBLISH)
        except Refused:  # each message's entry says why: the reference path (metered once)
            return await self._send_request(_parse_send(payload), context, caller)
        conn = self._connection(caller)
        return _sent(await self._send_batch(conn, wire, plain.born_ms, plain.items, plain.message_ids))

    def _prepare(
        self, caller: Caller, m: pb.Message, topics: dict[tuple[str, str], str], now_ms: int
    ) -> Prepared | rpc.SendResultEntry:
        """What storing ``m`` takes (its topic, properties, type), or the entry refusing it;
        ``topics`` holds the call's topics already named and allowed."""
        try:
            key = (m.topic.resource_namespace, m.topic.name)
            wire = topics.get(key, "")
            if not wire:
                wire = self._wire(caller, m.topic, "topic")
                self._allow(caller, "topic", wire, PUBLISH)
                topics[key] = wire
            body = m.body  # (each read of the field is a copy)
            if not body:
                raise Refused(pb.MESSAGE_BODY_EMPTY, "the message body is empty")
            store = self.broker.store
            assert store is not None
            if len(body) > store.config.max_message_size_bytes:
                raise Refused(
                    pb.MESSAGE_BODY_TOO_LARGE, f"the body is over {store.config.max_message_size_bytes} bytes"
                )
            props, mtype = to_properties(m, epoch_ms=now_ms)
        except MessageRefused as e:
            return rpc.SendResultEntry(status=pb.Status(code=e.code, message=str(e)))  # type: ignore[arg-type]
        except Refused as e:
            return rpc.SendResultEntry(status=e.status())
        born = m.system_properties.born_timestamp
        return Prepared(wire, props, mtype, born.seconds * 1000 + born.nanos // 1_000_000 or now_ms, body)

    def _failed(self, r: RemotingCommand | None) -> rpc.SendResultEntry | None:
        if r is not None and r.code == ResponseCode.SUCCESS:
            return None
        code = _CODES.get(ResponseCode(r.code), pb.INTERNAL_ERROR) if r is not None else pb.INTERNAL_ERROR
        return rpc.SendResultEntry(status=pb.Status(code=code, message=(r.remark if r else "") or "refused"))

    async def _send_one(self, conn: GrpcConnection, p: Prepared) -> rpc.SendResultEntry:
        """One message through the broker's SEND_MESSAGE_V2 handler (its plain fast path when it is
        a plain message)."""
        props, mtype = p.props, p.mtype
        group = ""
        if mtype == pb.TRANSACTION:
            group = props["PGROUP"] = transaction_group(p.wire)
        qid = self._fifo_queue(p.wire, props[PROPERTY_MESSAGE_GROUP]) if mtype == pb.FIFO else -1
        if qid < 0:
            tc = self.broker.topics.get(p.wire)
            qid = random.randrange(max(int(tc["writeQueueNums"]), 1)) if tc is not None else 0
        put_plain = self.broker.put_plain
        if put_plain is not None and mtype != pb.TRANSACTION:
            offset = put_plain(conn, p.wire, qid, p.born_ms, encode_properties(props).decode(), bytes(p.body))
            if offset is not None:
                due = props.get(PROPERTY_TIMER_DELIVER_MS)
                message_id = props[PROPERTY_UNIQ_KEY]
                return rpc.SendResultEntry(
                    status=ok(),
                    message_id=message_id,
                    offset=offset,
                    recall_handle=recall_handle(p.wire, message_id, int(due)) if due else "",
                )
        cmd = RemotingCommand(
            RequestCode.SEND_MESSAGE_V2,
            serialize_type=SERIALIZE_ROCKETMQ,
            ext_fields={
                "a": group or "CLIENT_INNER_PRODUCER", "b": p.wire, "c": "TBW102", "d": "4", "e": str(qid), "f": "0",
                "g": str(p.born_ms), "h": "0", "i": encode_properties(props).decode(), "j": "0", "k": "false",
            },
            body=bytes(p.body),
        )  # fmt: skip
        r = await self._handle(conn, cmd)
        failed = self._failed(r)
        if failed is not None:
            return failed
        assert r is not None
        ext = r.ext_fields or {}
        due = props.get(PROPERTY_TIMER_DELIVER_MS)
        message_id = props[PROPERTY_UNIQ_KEY]
        return rpc.SendResultEntry(
            status=ok(),
            message_id=message_id,
            transaction_id=ext.get("msgId", "") if mtype == pb.TRANSACTION else "",
            offset=int(ext.get("queueOffset", "0") or 0),
            recall_handle=recall_handle(p.wire, message_id, int(due)) if due else "",
        )

    async def _send_batch(
        self, conn: GrpcConnection, wire: str, born_ms: int, items: bytes, ids: list[str]
    ) -> list[rpc.SendResultEntry] | bytes:
        """Plain messages of one topic, ``items`` their SEND_BATCH_MESSAGE body: one queue, one
        append (the broker's plain batch path when it takes them, else the send handler). The
        whole answer, serialized, when all are stored; else the entry refusing them, each."""
        tc = self.broker.topics.get(wire)
        qid = random.randrange(max(int(tc["writeQueueNums"]), 1)) if tc is not None else 0
        put_plain = self.broker.put_plain
        if len(ids) == 1 and put_plain is not None:
            # One message: the single send's append, staged and written with the others of this
            # turn of the loop (a batch is written at once). Its item: head, body, properties.
            *_head, body_len = BATCH_ITEM_HEAD.unpack_from(items)
            body_at = BATCH_ITEM_HEAD.size
            props = items[body_at + body_len + 2 :]  # (after the properties' 2-byte length)
            offset = put_plain(conn, wire, qid, born_ms, props, memoryview(items)[body_at : body_at + body_len])
            if offset is not None:
                return _stored(ids, offset)
        put_plain_batch = self.broker.put_plain_batch
        if put_plain_batch is not None:
            first = put_plain_batch(conn, wire, qid, born_ms, items)
            if first is not None:
                return _stored(ids, first)
        cmd = RemotingCommand(
            RequestCode.SEND_BATCH_MESSAGE,
            serialize_type=SERIALIZE_ROCKETMQ,
            ext_fields={
                "a": "CLIENT_INNER_PRODUCER", "b": wire, "c": "TBW102", "d": "4", "e": str(qid), "f": "0",
                "g": str(born_ms), "h": "0", "i": "", "j": "0", "k": "false", "m": "true",
            },
            body=items,
        )  # fmt: skip
        r = await self._handle(conn, cmd)
        failed = self._failed(r)
        if failed is not None:
            return [failed] * len(ids)
        assert r is not None
        first = int((r.ext_fields or {}).get("queueOffset", "0") or 0)
        return _stored(ids, first)

    async def _handle(self, conn: GrpcConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        """``cmd`` through the broker's own handler for its code (a gRPC client is its connection)."""
        r = self.broker.processors.handlers[cmd.code](conn, cmd)  # type: ignore[arg-type]
        if r is None or isinstance(r, RemotingCommand):
            return r
        return await r

    def _fifo_queue(self, wire: str, message_group: str) -> int:
        """A message group's queue: the same one for every message of the group."""
        tc = self.broker.topics.get(wire)
        n = int(tc["writeQueueNums"]) if tc is not None else 1
        return zlib.crc32(message_group.encode()) % max(n, 1)

    # --- receiving (POP) ------------------------------------------------------------------------------
    async def ReceiveMessage(
        self, request: rpc.ReceiveMessageRequest, context: Context
    ) -> AsyncIterator[rpc.ReceiveMessageResponse | Framed]:
        refusal: pb.Status | None = None
        try:
            caller = await self._caller(context)
            wire, deliveries, invisible_ms = await self._receive(caller, request)
        except Refused as e:
            self.refused += 1
            refusal = e.status()
        except PopError as e:
            refusal = pb.Status(code=_POP_CODES.get(e.code, pb.INTERNAL_ERROR), message=str(e))
        if refusal is not None:
            yield rpc.ReceiveMessageResponse(status=refusal)
            return
        if not deliveries:
            yield rpc.ReceiveMessageResponse(status=pb.Status(code=pb.MESSAGE_NOT_FOUND, message="no new message"))
            return
        # The answers, in order: OK, the delivery time, then each message; framed together and
        # sent as one write (``Framed``) rather than one message at a time.
        now = rpc.ReceiveMessageResponse()
        now.delivery_timestamp.GetCurrentTime()
        parts = [_RECEIVED_OK, framed(now.SerializeToString())]
        res = resource_of(wire)
        for d in deliveries:
            if V2_CODEC is not None:  # (each answer written straight from its record; None: the reference path)
                written = V2_CODEC.received_records(
                    d.records, wire, res.resource_namespace, res.name, d.queue_id, d.seq, d.attempt, invisible_ms,
                    SYSTEM_PROPERTIES,
                )  # fmt: skip
            else:
                written = [None] * len(d.records)
            for i, answer in enumerate(written):
                if answer is not None:
                    parts.append(answer)
                    continue
                rec = decode_record(d.records[i], check_crc=False)
                reply = rpc.ReceiveMessageResponse()
                to_message(
                    rec, handle=d.handle(i), attempt=d.attempt, invisible_ms=invisible_ms,
                    topic=res if rec.topic == wire else None, into=reply.message,
                )  # fmt: skip
                parts.append(framed(reply.SerializeToString()))
        yield Framed(b"".join(parts))

    async def _receive(self, caller: Caller, request: rpc.ReceiveMessageRequest) -> tuple[str, list[Delivery], int]:
        wire = self._wire(caller, request.message_queue.topic, "topic")
        group = self._wire(caller, request.group, "group")
        self._allow(caller, "group", group, SUBSCRIBE)
        self._allow(caller, "topic", wire, SUBSCRIBE)
        self._check_not_v4_group(group)
        tenancy = self.broker.tenancy
        if tenancy is not None:
            cmd = RemotingCommand(RequestCode.PULL_MESSAGE)
            refused = tenancy.before_pull(cmd, wire)
            if refused is not None:
                raise Refused(pb.TOO_MANY_REQUESTS, refused.remark or "over the consume quota")
        g = self.broker.groups.find(group)
        if g is None:
            raise Refused(pb.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} does not exist")
        tc = self.broker.topics.get(wire)
        if tc is None:
            raise Refused(pb.TOPIC_NOT_FOUND, f"topic {wire!r} does not exist")
        if not int(tc["perm"]) & PERM_READ:
            raise Refused(pb.FORBIDDEN, f"topic {wire!r} is not readable")
        invisible_ms = DEFAULT_INVISIBLE_MS
        if request.HasField("invisible_duration"):
            invisible_ms = request.invisible_duration.ToMilliseconds()
            if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
                raise Refused(
                    pb.ILLEGAL_INVISIBLE_TIME, f"the invisible duration must be {MIN_INVISIBLE_MS} ms to 12 h"
                )
        wait_ms = 0
        if request.HasField("long_polling_timeout"):
            wait_ms = request.long_polling_timeout.ToMilliseconds()
            if not 0 <= wait_ms <= MAX_POLL_MS:
                raise Refused(pb.ILLEGAL_POLLING_TIME, f"the long-polling timeout must be 0 to {MAX_POLL_MS} ms")
        accepts = self._filter(request.filter_expression)
        nq = int(tc["readQueueNums"])
        first = request.message_queue.id if 0 <= request.message_queue.id < nq else 0
        order = [(first + i) % nq for i in range(nq)]
        fifo = bool(g.get("consumeMessageOrderly", False))
        max_attempts = int(g.get("retryMaxTimes", 16)) + 1
        pop = self.broker.pop
        if pop is None:
            raise Refused(pb.HA_NOT_AVAILABLE, "this broker does not take POP requests now")
        deliveries = await pop.receive(
            group, wire, order, request.batch_size or 32, invisible_ms, accepts,
            fifo=fifo, max_attempts=max_attempts, wait_ms=wait_ms, dead_letter=self._dead_letter,
        )  # fmt: skip
        if deliveries and tenancy is not None:
            tenancy.after_pull(wire, sum(len(d.offsets) for d in deliveries), sum(d.body_bytes for d in deliveries))
        return wire, deliveries, invisible_ms

    def _filter(self, expr: pb.FilterExpression) -> Callable[[StoredMessage], bool]:
        text = expr.expression.strip()
        if expr.type == pb.SQL:
            if not self.broker.config.enable_property_filter:
                raise Refused(pb.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not enabled on this broker")
            try:
                predicate = compile_sql92(text)
            except SqlParseError as e:
                raise Refused(pb.ILLEGAL_FILTER_EXPRESSION, f"bad SQL92 filter: {e}") from None
            return lambda m: bool(predicate(m.properties))
        if not text or text == "*":
            return TagFilter()
        if len(text) > 1024 or parse_tag_expression(text) is None:
            raise Refused(pb.ILLEGAL_FILTER_EXPRESSION, f"bad tag expression {text[:64]!r}")
        return TagFilter(frozenset(t.strip() for t in text.split("||") if t.strip()))

    async def _dead_letter(self, group: str, msg: StoredMessage) -> None:
        """Copy ``msg`` to ``group``'s dead-letter topic (its last attempt ran out)."""
        _special, tenant, name = parse_wire_name(group)
        topic = dlq_topic(tenant, name) if tenant is not None else f"%DLQ%{group}"
        topics = self.broker.topics
        if topics.get(topic) is None:
            topics.create_or_update(topic, read_queue_nums=1, write_queue_nums=1, perm=6)
            self.broker.topics_changed()
        props = copy_properties(msg, delay_level=None)  # as the 4.x send-back's dead-letter copy
        for stale in (PROPERTY_TIMER_DELIVER_MS, "TIMER_OUT_MS"):
            props.pop(stale, None)
        cmd = RemotingCommand(
            RequestCode.SEND_MESSAGE,
            serialize_type=SERIALIZE_ROCKETMQ,
            ext_fields={
                "producerGroup": group, "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "1",
                "queueId": "0", "sysFlag": "0", "bornTimestamp": str(msg.born_timestamp), "flag": str(msg.flag),
                "properties": encode_properties(props).decode(), "reconsumeTimes": str(msg.reconsume_times + 1),
            },
            body=msg.body,
        )  # fmt: skip
        conn = GrpcConnection("broker-dlq", "127.0.0.1:0")
        r = await self._handle(conn, cmd)
        if r is None or r.code != ResponseCode.SUCCESS:
            raise PopError("store", f"the dead-letter copy was refused: {r.remark if r else 'no answer'}")

    async def AckMessage(self, request: rpc.AckMessageRequest, context: Context) -> Any:
        async def work() -> rpc.AckMessageResponse | bytes:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            group = self._wire(caller, request.group, "group")
            self._allow(caller, "group", group, SUBSCRIBE)
            self._allow(caller, "topic", wire, SUBSCRIBE)
            if not request.entries or len(request.entries) > 1024:
                raise Refused(pb.BAD_REQUEST, "an acknowledgement names 1 to 1024 receipt handles")
            pop = self.broker.pop
            if pop is None:
                raise Refused(pb.HA_NOT_AVAILABLE, "this broker does not take POP requests now")
            given = request.entries
            answers = await pop.ack(group, wire, [e.receipt_handle for e in given])
            if not any(answers):  # every one acknowledged: the answer written straight (answers.ack_ok)
                return ack_ok([(e.message_id, e.receipt_handle) for e in given])
            entries = []
            for e, a in zip(request.entries, answers, strict=True):
                st = ok() if a is None else pb.Status(code=_POP_CODES.get(a.code, pb.INTERNAL_ERROR), message=str(a))
                entries.append(
                    rpc.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=st)
                )
            bad = [x.status for x in entries if x.status.code != pb.OK]
            if not bad:
                status = ok()
            elif len(bad) == len(entries):
                status = bad[0]
            else:
                status = pb.Status(code=pb.MULTIPLE_RESULTS, message=f"{len(bad)} of {len(entries)} failed")
            return rpc.AckMessageResponse(status=status, entries=entries)

        return await self._guard(lambda s: rpc.AckMessageResponse(status=s), work())

    async def ChangeInvisibleDuration(self, request: rpc.ChangeInvisibleDurationRequest, context: Context) -> Any:
        async def work() -> rpc.ChangeInvisibleDurationResponse:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            group = self._wire(caller, request.group, "group")
            self._allow(caller, "group", group, SUBSCRIBE)
            self._allow(caller, "topic", wire, SUBSCRIBE)
            ms = request.invisible_duration.ToMilliseconds()
            if not 0 <= ms <= MAX_INVISIBLE_MS:
                raise Refused(pb.ILLEGAL_INVISIBLE_TIME, "the invisible duration must be 0 to 12 h")
            pop = self.broker.pop
            if pop is None:
                raise Refused(pb.HA_NOT_AVAILABLE, "this broker does not take POP requests now")
            handle = await pop.change_invisible(group, wire, request.receipt_handle, ms)
            return rpc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle or "")

        return await self._guard(
            lambda s: rpc.ChangeInvisibleDurationResponse(status=s, receipt_handle=request.receipt_handle), work()
        )

    async def ForwardMessageToDeadLetterQueue(
        self, request: rpc.ForwardMessageToDeadLetterQueueRequest, context: Context
    ) -> Any:
        async def work() -> rpc.ForwardMessageToDeadLetterQueueResponse:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            group = self._wire(caller, request.group, "group")
            self._allow(caller, "group", group, SUBSCRIBE)
            self._allow(caller, "topic", wire, SUBSCRIBE)
            pop = self.broker.pop
            if pop is None:
                raise Refused(pb.HA_NOT_AVAILABLE, "this broker does not take POP requests now")
            msg = pop.leased_message(group, wire, request.receipt_handle)  # a stale handle: refused
            if msg is not None:  # the copy first: if it is refused, the lease stays
                await self._dead_letter(group, msg)
                pop.dead_lettered += 1
            await pop.finish(group, wire, request.receipt_handle)
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=ok())

        return await self._guard(lambda s: rpc.ForwardMessageToDeadLetterQueueResponse(status=s), work())

    # --- transactions ---------------------------------------------------------------------------------
    async def EndTransaction(self, request: rpc.EndTransactionRequest, context: Context) -> Any:
        async def work() -> rpc.EndTransactionResponse:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            self._allow(caller, "topic", wire, PUBLISH)
            if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
                return rpc.EndTransactionResponse(status=ok())  # unknown: the check asks again later
            transactions = self.broker.transactions
            store = self.broker.store
            if transactions is None or store is None or not self.broker.writable:
                raise Refused(pb.HA_NOT_AVAILABLE, "this broker does not take transactions now")
            try:
                _host, offset = decode_transaction_id(request.transaction_id)
            except ValueError:
                raise Refused(pb.INVALID_TRANSACTION_ID, "not a transaction id this broker issued") from None
            half = store.look_message_by_offset(offset)
            if (
                half is None
                or half.topic != RMQ_SYS_TRANS_HALF_TOPIC
                or half.properties.get(PROPERTY_REAL_TOPIC) != wire
                or half.properties.get(PROPERTY_UNIQ_KEY) != request.message_id
            ):
                raise Refused(pb.INVALID_TRANSACTION_ID, "no prepared message of this topic has this transaction id")
            r = transactions.resolve(None, half, commit=request.resolution == pb.COMMIT)
            if r is not None and not isinstance(r, RemotingCommand):
                r = await r
            if isinstance(r, RemotingCommand) and r.code != ResponseCode.SUCCESS:
                code = _CODES.get(ResponseCode(r.code), pb.INTERNAL_ERROR)
                raise Refused(code, r.remark or "the transaction could not be ended")
            return rpc.EndTransactionResponse(status=ok())

        return await self._guard(lambda s: rpc.EndTransactionResponse(status=s), work())

    async def RecallMessage(self, request: rpc.RecallMessageRequest, context: Context) -> Any:
        async def work() -> rpc.RecallMessageResponse:
            caller = await self._caller(context)
            wire = self._wire(caller, request.topic, "topic")
            self._allow(caller, "topic", wire, PUBLISH)
            try:
                topic, message_id, due_ms = parse_recall_handle(request.recall_handle)
            except ValueError:
                raise Refused(pb.BAD_REQUEST, "not a recall handle this broker issued") from None
            if topic != wire:
                raise Refused(pb.BAD_REQUEST, "the recall handle is for another topic")
            timers = self.broker.schedule.timers
            store = self.broker.store
            if timers is None or store is None or not self.broker.writable:
                raise Refused(pb.HA_NOT_AVAILABLE, "this broker does not take recalls now")
            now = int(time.time() * 1000)
            if due_ms <= now:
                raise Refused(pb.NOT_FOUND, "the message was due already: it is delivered, or about to be")
            if due_ms > now + self.broker.config.timer_max_delay_s * 1000:
                raise Refused(pb.BAD_REQUEST, "no timed message here is due that late")
            try:
                status, end = timers.recalls.recall(store, wire, message_id, due_ms)
            except ValueError as e:
                raise Refused(pb.TOO_MANY_REQUESTS, str(e)) from None
            if status is not PutMessageStatus.PUT_OK:
                raise Refused(pb.INTERNAL_ERROR, f"the recall could not be stored ({status.name})")
            replication = self.broker.replication
            got = await replication.acknowledged(end) if replication is not None else PutMessageStatus.PUT_OK
            if got is not PutMessageStatus.PUT_OK:
                raise Refused(pb.SLAVE_PERSISTENCE_TIMEOUT, f"the recall is not replicated ({got.name})")
            return rpc.RecallMessageResponse(status=ok(), message_id=message_id)

        return await self._guard(lambda s: rpc.RecallMessageResponse(status=s), work())

    async def _unsupported_status(self, context: Context, what: str) -> pb.Status:
        try:
            await self._caller(context)  # unauthenticated callers learn nothing, not even this
        except Refused as e:
            return e.status()
        return await super()._unsupported_status(context, what)

    # --- the telemetry stream ------------------------------------------------------------------------
    async def Telemetry(
        self, request_iterator: AsyncIterator[rpc.TelemetryCommand], context: Context
    ) -> AsyncIterator[rpc.TelemetryCommand]:
        try:
            caller = await self._caller(context)
            conn = self._connection(caller)
        except Refused as e:
            yield rpc.TelemetryCommand(status=e.status())
            return
        outbox: asyncio.Queue[rpc.TelemetryCommand | None] = asyncio.Queue(maxsize=1024)
        conn.telemetry = outbox

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if cmd.HasField("settings"):
                        try:
                            answer = self._settings(caller, conn, cmd.settings)
                        except Refused as e:
                            answer = rpc.TelemetryCommand(status=e.status())
                        outbox.put_nowait(answer)
            except (asyncio.QueueFull, grpc.aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                outbox.put_nowait(None) if not outbox.full() else None

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            if conn.telemetry is outbox:
                conn.telemetry = None

    def _settings(self, caller: Caller, conn: GrpcConnection, s: pb.Settings) -> rpc.TelemetryCommand:
        out = pb.Settings()
        out.CopyFrom(s)
        out.ClearField("metric")
        out.request_timeout.FromSeconds(3)
        if s.client_type == pb.PRODUCER:
            store = self.broker.store
            out.publishing.max_body_size = store.config.max_message_size_bytes if store is not None else 4 << 20
            out.publishing.validate_message_type = True
            out.backoff_policy.max_attempts = 3
            eb = out.backoff_policy.exponential_backoff
            eb.initial.FromMilliseconds(10)
            eb.max.FromSeconds(1)
            eb.multiplier = 2.0
            for t in s.publishing.topics:
                wire = self._wire(caller, t, "topic")
                self._allow(caller, "topic", wire, PUBLISH)
                conn.producer_topics.add(wire)
                self.broker.clients.note_half_sender(conn, transaction_group(wire))  # type: ignore[arg-type]
        elif s.client_type in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
            group = self._wire(caller, s.subscription.group, "group")
            self._allow(caller, "group", group, SUBSCRIBE)
            g = self.broker.groups.find(group)
            fifo = bool(g.get("consumeMessageOrderly", False)) if g is not None else False
            max_attempts = int(g.get("retryMaxTimes", 16)) + 1 if g is not None else 17
            out.subscription.fifo = fifo
            out.subscription.receive_batch_size = 32
            if not s.subscription.HasField("long_polling_timeout"):
                out.subscription.long_polling_timeout.FromSeconds(20)
            out.backoff_policy.max_attempts = max_attempts
            out.backoff_policy.customized_backoff.SetInParent()
            for sec in RETRY_BACKOFF_S[: max(1, max_attempts - 1)]:
                out.backoff_policy.customized_backoff.next.add().FromSeconds(sec)
            conn.groups.add(group)
        return rpc.TelemetryCommand(status=ok(), settings=out)


def transaction_group(topic_wire: str) -> str:
    """The producer group a v5 transactional message is checked under: one per topic (the v5
    producer has no group), in the topic's tenant."""
    _special, tenant, name = parse_wire_name(topic_wire)
    base = f"v5tx-{name if tenant is not None else topic_wire}"[:64]
    return f"{tenant}%{base}" if tenant is not None else base


def decode_transaction_id(tid: str) -> tuple[str, int]:
    """The (store host, CommitLog offset) of a transaction id: the half message's offset id."""
    if len(tid) != 32 or any(c not in "0123456789ABCDEFabcdef" for c in tid):
        raise ValueError(tid)
    return tid[:16], int(tid[16:], 16)


_ = encode_message_id  # the form decode_transaction_id reads
