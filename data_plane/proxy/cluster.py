"""``orbit proxy``: the RocketMQ 5 endpoint in front of a whole cluster (RocketMQ 5's "cluster"
proxy mode). Clients connect to the proxy only; it finds a topic's brokers through the name
servers and forwards each call to the gRPC endpoint of the broker it concerns, with the client's
own metadata, so that each broker authenticates and authorizes the client itself (the proxy holds
no tenant secret). What the proxy adds:

* routes: QueryRoute and QueryAssignment merge the brokers' answers and name the proxy as every
  queue's endpoint;
* sends: a SendMessage goes to one of the topic's brokers, in turn (a message group's always to
  the same one, so that its order holds);
* handles: receipt handles, transaction ids and recall handles leave the proxy prefixed with the
  broker's name (``<broker>@<handle>``), so the calls that bring them back reach that broker;
* Telemetry: a client's stream is opened to each broker of its topics; the first broker's Settings
  answer the client, and check-backs from any broker reach it (their transaction ids prefixed).

Brokers' gRPC endpoints come from their runtime information (``grpcAddress``), asked with the
proxy's own credential (a broker or operator credential, ``--credentials-file``), as are routes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc

from data_plane.auth.signature import ACCESS_KEY, SIGNATURE, sign
from data_plane.proxy.unsupported import Unsupported
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc
from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingError

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
SEP: Final = "@"
ROUTE_TTL_S: Final = 10.0
CALL_TIMEOUT_S: Final = 35.0  # above the longest long-poll a receive may ask for
FORWARDED: Final = ("authorization", "x-mq-date-time", "x-mq-namespace", "x-mq-client-id", "x-mq-request-id",
                    "x-mq-language", "x-mq-protocol", "x-mq-client-version")  # fmt: skip


class ProxyRefused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.status = pb.Status(code=code, message=message)  # type: ignore[arg-type]


def prefixed(broker: str, value: str) -> str:
    return f"{broker}{SEP}{value}" if value else value


def split(value: str) -> tuple[str, str]:
    broker, sep, rest = value.partition(SEP)
    if not sep or not broker or not rest:
        raise ProxyRefused(pb.INVALID_RECEIPT_HANDLE, "not a handle this proxy issued")
    return broker, rest


class ClusterProxy(Unsupported, service_pb2_grpc.MessagingServiceServicer):
    def __init__(
        self, namesrv_addrs: list[str], advertised: tuple[str, int], credential: tuple[str, str] | None
    ) -> None:
        self.namesrv_addrs = namesrv_addrs
        self.advertised = advertised
        self.credential = credential
        self.remoting = RemotingClient()
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.grpc_of: dict[str, str] = {}  # broker name -> its master's gRPC endpoint
        self.master_of: dict[str, str] = {}  # broker name -> the master address that endpoint is of
        self.routes: dict[str, tuple[float, list[str]]] = {}  # topic wire name -> (fetched, broker names)
        self.turn = itertools.count()

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()
        await self.remoting.close()

    # --- the cluster ------------------------------------------------------------------------------
    def _signed(self, cmd: RemotingCommand) -> RemotingCommand:
        if self.credential is not None:
            ak, secret = self.credential
            fields = {**(cmd.ext_fields or {}), ACCESS_KEY: ak}
            fields[SIGNATURE] = sign(fields, cmd.body_bytes(), secret)
            cmd.ext_fields = fields
        return cmd

    async def _brokers(self, wire: str) -> list[str]:
        """Names of the brokers that hold ``wire``, their gRPC endpoints known."""
        hit = self.routes.get(wire)
        if hit is not None and time.monotonic() - hit[0] < ROUTE_TTL_S:
            return hit[1]
        route: dict[str, Any] | None = None
        for addr in self.namesrv_addrs:
            try:
                cmd = self._signed(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": wire}))
                r = await self.remoting.invoke(addr, cmd, 3000)
            except RemotingError:
                continue
            if r.code == ResponseCode.SUCCESS:
                route = bodies.loads_object(r.body_bytes())
                break
            if r.code == ResponseCode.TOPIC_NOT_EXIST:
                raise ProxyRefused(pb.TOPIC_NOT_FOUND, f"topic {wire!r} does not exist")
        if route is None:
            raise ProxyRefused(pb.PROXY_TIMEOUT, "no name server answered for the topic's route")
        names = []
        for bd in route.get("brokerDatas") or ():
            name = bd.get("brokerName")
            master = (bd.get("brokerAddrs") or {}).get("0")
            if not name or not master:
                continue
            if self.master_of.get(name) != master:  # new, or a failover moved the master
                try:
                    info = await self.remoting.invoke(
                        master, self._signed(RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO)), 3000
                    )
                except RemotingError as e:
                    log.warning("broker %s at %s did not answer: %s", name, master, e)
                    continue
                table = bodies.loads_object(info.body_bytes()).get("table", {}) if info.code == 0 else {}
                if not table.get("grpcAddress"):
                    continue  # a broker without a gRPC endpoint serves no v5 client
                self.grpc_of[name] = table["grpcAddress"]
                self.master_of[name] = master
            names.append(name)
        if not names:
            raise ProxyRefused(pb.TOPIC_NOT_FOUND, f"no master with a gRPC endpoint holds topic {wire!r}")
        self.routes[wire] = (time.monotonic(), names)
        return names

    def _stub(self, broker: str) -> service_pb2_grpc.MessagingServiceStub:
        addr = self.grpc_of.get(broker)
        if addr is None:
            raise ProxyRefused(pb.NOT_FOUND, f"broker {broker!r} is not known to this proxy")
        ch = self.channels.get(addr)
        if ch is None:
            ch = self.channels[addr] = grpc.aio.insecure_channel(addr)
        return service_pb2_grpc.MessagingServiceStub(ch)  # type: ignore[no-untyped-call]

    @staticmethod
    def _metadata(context: Context) -> tuple[tuple[str, str], ...]:
        return tuple((k, v) for k, v in (context.invocation_metadata() or ()) if k in FORWARDED and isinstance(v, str))

    @staticmethod
    def _wire(context: Context, res: pb.Resource) -> str:
        ns = res.resource_namespace
        if not ns:
            given = dict(context.invocation_metadata() or ()).get("x-mq-namespace", "")
            ns = given if isinstance(given, str) else ""
        if len(res.name) > 64 or len(ns) > 64:
            raise ProxyRefused(pb.ILLEGAL_TOPIC, "names are at most 64 characters")
        return f"{ns}%{res.name}" if ns else res.name

    def _own(self, q: pb.MessageQueue) -> pb.MessageQueue:
        out = pb.MessageQueue()
        out.CopyFrom(q)
        host, port = self.advertised
        out.broker.endpoints.CopyFrom(pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=port)]))
        return out

    async def _guard(self, answer: Callable[[pb.Status], Any], work: Any) -> Any:
        try:
            return await work
        except ProxyRefused as e:
            return answer(e.status)
        except grpc.aio.AioRpcError as e:
            return answer(pb.Status(code=pb.PROXY_TIMEOUT, message=f"the broker did not answer: {e.code().name}"))

    # --- routes ------------------------------------------------------------------------------------
    async def QueryRoute(self, request: rpc.QueryRouteRequest, context: Context) -> Any:
        async def work() -> rpc.QueryRouteResponse:
            md = self._metadata(context)
            queues: list[pb.MessageQueue] = []
            for broker in await self._brokers(self._wire(context, request.topic)):
                r = await self._stub(broker).QueryRoute(request, metadata=md, timeout=CALL_TIMEOUT_S)
                if r.status.code != pb.OK:
                    return r  # type: ignore[no-any-return]
                queues += [self._own(q) for q in r.message_queues]
            return rpc.QueryRouteResponse(status=pb.Status(code=pb.OK, message="OK"), message_queues=queues)

        return await self._guard(lambda s: rpc.QueryRouteResponse(status=s), work())

    async def QueryAssignment(self, request: rpc.QueryAssignmentRequest, context: Context) -> Any:
        async def work() -> rpc.QueryAssignmentResponse:
            md = self._metadata(context)
            out: list[pb.Assignment] = []
            for broker in await self._brokers(self._wire(context, request.topic)):
                r = await self._stub(broker).QueryAssignment(request, metadata=md, timeout=CALL_TIMEOUT_S)
                if r.status.code != pb.OK:
                    return r  # type: ignore[no-any-return]
                out += [pb.Assignment(message_queue=self._own(a.message_queue)) for a in r.assignments]
            return rpc.QueryAssignmentResponse(status=pb.Status(code=pb.OK, message="OK"), assignments=out)

        return await self._guard(lambda s: rpc.QueryAssignmentResponse(status=s), work())

    async def _all(self, call: str, request: Any, context: Context, answer: Callable[[pb.Status], Any]) -> Any:
        """``call`` to every broker this proxy knows (heartbeats, terminations): the first refusal."""
        md = self._metadata(context)
        for broker in list(self.grpc_of):
            r = await getattr(self._stub(broker), call)(request, metadata=md, timeout=CALL_TIMEOUT_S)
            if r.status.code != pb.OK:
                return r
        return answer(pb.Status(code=pb.OK, message="OK"))

    async def Heartbeat(self, request: rpc.HeartbeatRequest, context: Context) -> Any:
        answer = lambda s: rpc.HeartbeatResponse(status=s)  # noqa: E731
        return await self._guard(answer, self._all("Heartbeat", request, context, answer))

    async def NotifyClientTermination(self, request: rpc.NotifyClientTerminationRequest, context: Context) -> Any:
        answer = lambda s: rpc.NotifyClientTerminationResponse(status=s)  # noqa: E731
        return await self._guard(answer, self._all("NotifyClientTermination", request, context, answer))

    # --- sending ------------------------------------------------------------------------------------
    async def SendMessage(self, request: rpc.SendMessageRequest, context: Context) -> Any:
        async def work() -> rpc.SendMessageResponse:
            if not request.messages:
                raise ProxyRefused(pb.BAD_REQUEST, "the request holds no message")
            first = request.messages[0]
            brokers = await self._brokers(self._wire(context, first.topic))
            if first.system_properties.HasField("message_group"):  # a message group stays on one broker
                broker = brokers[zlib.crc32(first.system_properties.message_group.encode()) % len(brokers)]
            else:
                broker = brokers[next(self.turn) % len(brokers)]
            r: rpc.SendMessageResponse = await self._stub(broker).SendMessage(
                request, metadata=self._metadata(context), timeout=CALL_TIMEOUT_S
            )
            for e in r.entries:
                e.transaction_id = prefixed(broker, e.transaction_id)
                e.recall_handle = prefixed(broker, e.recall_handle)
            return r

        return await self._guard(lambda s: rpc.SendMessageResponse(status=s), work())

    async def _by_handle(self, method: str, request: Any, field: str, context: Context) -> tuple[str, Any]:
        """``request`` to the broker its ``field`` (a handle or id this proxy prefixed) names, the
        prefix taken off: (the broker, its answer)."""
        broker, value = split(getattr(request, field))
        forwarded = type(request)()
        forwarded.CopyFrom(request)
        setattr(forwarded, field, value)
        stub = self._stub(broker)
        return broker, await getattr(stub, method)(forwarded, metadata=self._metadata(context), timeout=CALL_TIMEOUT_S)

    async def EndTransaction(self, request: rpc.EndTransactionRequest, context: Context) -> Any:
        async def work() -> Any:
            return (await self._by_handle("EndTransaction", request, "transaction_id", context))[1]

        return await self._guard(lambda s: rpc.EndTransactionResponse(status=s), work())

    async def RecallMessage(self, request: rpc.RecallMessageRequest, context: Context) -> Any:
        async def work() -> Any:
            return (await self._by_handle("RecallMessage", request, "recall_handle", context))[1]

        return await self._guard(lambda s: rpc.RecallMessageResponse(status=s), work())

    # --- receiving ----------------------------------------------------------------------------------
    async def ReceiveMessage(self, request: rpc.ReceiveMessageRequest, context: Context) -> AsyncIterator[Any]:
        broker = request.message_queue.broker.name
        try:
            stub = self._stub(broker)
            async for r in stub.ReceiveMessage(request, metadata=self._metadata(context), timeout=CALL_TIMEOUT_S):
                if r.HasField("message"):
                    sp = r.message.system_properties
                    sp.receipt_handle = prefixed(broker, sp.receipt_handle)
                yield r
        except ProxyRefused as e:
            yield rpc.ReceiveMessageResponse(status=e.status)
        except grpc.aio.AioRpcError as e:
            yield rpc.ReceiveMessageResponse(status=pb.Status(code=pb.PROXY_TIMEOUT, message=e.code().name))

    async def AckMessage(self, request: rpc.AckMessageRequest, context: Context) -> Any:
        async def work() -> rpc.AckMessageResponse:
            by_broker: dict[str, list[rpc.AckMessageEntry]] = {}
            for e in request.entries:
                broker, handle = split(e.receipt_handle)
                by_broker.setdefault(broker, []).append(
                    rpc.AckMessageEntry(message_id=e.message_id, receipt_handle=handle)
                )
            entries: list[rpc.AckMessageResultEntry] = []
            status = pb.Status(code=pb.OK, message="OK")
            for broker, mine in by_broker.items():
                sub = rpc.AckMessageRequest(group=request.group, topic=request.topic, entries=mine)
                r = await self._stub(broker).AckMessage(sub, metadata=self._metadata(context), timeout=CALL_TIMEOUT_S)
                for x in r.entries:
                    x.receipt_handle = prefixed(broker, x.receipt_handle)
                entries += list(r.entries)
                if r.status.code != pb.OK:
                    status = r.status
            return rpc.AckMessageResponse(status=status, entries=entries)

        return await self._guard(lambda s: rpc.AckMessageResponse(status=s), work())

    async def ChangeInvisibleDuration(self, request: rpc.ChangeInvisibleDurationRequest, context: Context) -> Any:
        async def work() -> Any:
            broker, r = await self._by_handle("ChangeInvisibleDuration", request, "receipt_handle", context)
            r.receipt_handle = prefixed(broker, r.receipt_handle)
            return r

        return await self._guard(
            lambda s: rpc.ChangeInvisibleDurationResponse(status=s, receipt_handle=request.receipt_handle), work()
        )

    async def ForwardMessageToDeadLetterQueue(
        self, request: rpc.ForwardMessageToDeadLetterQueueRequest, context: Context
    ) -> Any:
        async def work() -> Any:
            return (await self._by_handle("ForwardMessageToDeadLetterQueue", request, "receipt_handle", context))[1]

        return await self._guard(lambda s: rpc.ForwardMessageToDeadLetterQueueResponse(status=s), work())

    # --- the telemetry stream ------------------------------------------------------------------------
    async def Telemetry(
        self, request_iterator: AsyncIterator[rpc.TelemetryCommand], context: Context
    ) -> AsyncIterator[rpc.TelemetryCommand]:
        relay = _TelemetryRelay(self, context)
        reader = asyncio.get_running_loop().create_task(relay.read(request_iterator))
        try:
            while (item := await relay.outbox.get()) is not None:
                yield item
        finally:
            reader.cancel()
            relay.close()


class _TelemetryRelay:
    """One client's Telemetry stream, opened on to each broker of its topics: the client's
    Settings go to every one; the first broker's Settings answer it; check-backs from any reach it."""

    def __init__(self, proxy: ClusterProxy, context: Context) -> None:
        self.proxy = proxy
        self.context = context
        self.md = proxy._metadata(context)
        self.outbox: asyncio.Queue[rpc.TelemetryCommand | None] = asyncio.Queue(maxsize=1024)
        self.streams: dict[str, Any] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.answered = asyncio.Event()

    async def relay(self, broker: str, call: Any) -> None:
        try:
            async for cmd in call:
                if cmd.HasField("recover_orphaned_transaction_command"):
                    c = cmd.recover_orphaned_transaction_command
                    c.transaction_id = prefixed(broker, c.transaction_id)
                    self.outbox.put_nowait(cmd)
                elif cmd.HasField("settings") and not self.answered.is_set():
                    self.answered.set()
                    self.outbox.put_nowait(cmd)
        except (grpc.aio.AioRpcError, asyncio.QueueFull):
            pass

    async def _brokers(self, s: pb.Settings) -> set[str]:
        topics = list(s.publishing.topics) + [e.topic for e in s.subscription.subscriptions]
        brokers: set[str] = set()
        for t in topics:
            try:
                brokers.update(await self.proxy._brokers(self.proxy._wire(self.context, t)))
            except ProxyRefused as e:
                self.outbox.put_nowait(rpc.TelemetryCommand(status=e.status))
        return brokers

    async def read(self, request_iterator: AsyncIterator[rpc.TelemetryCommand]) -> None:
        try:
            async for cmd in request_iterator:
                if not cmd.HasField("settings"):
                    continue
                brokers = await self._brokers(cmd.settings)
                self.answered.clear()
                for broker in brokers:
                    if broker not in self.streams:
                        call = self.streams[broker] = self.proxy._stub(broker).Telemetry(metadata=self.md)
                        self.tasks.append(asyncio.get_running_loop().create_task(self.relay(broker, call)))
                    await self.streams[broker].write(cmd)
                if not brokers:
                    ok = pb.Status(code=pb.OK, message="OK")
                    self.outbox.put_nowait(rpc.TelemetryCommand(status=ok, settings=cmd.settings))
        except (grpc.aio.AioRpcError, asyncio.QueueFull, asyncio.CancelledError):
            pass
        finally:
            if not self.outbox.full():
                self.outbox.put_nowait(None)

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for call in self.streams.values():
            call.cancel()


async def serve(
    listen: str, namesrv_addrs: list[str], advertised_host: str, credential: tuple[str, str] | None,
    ready: Callable[[str], None],
) -> None:  # fmt: skip
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 80 << 20), ("grpc.max_send_message_length", 80 << 20),
            ("grpc.max_concurrent_streams", 256), ("grpc.max_metadata_size", 16 * 1024),
        ],
        maximum_concurrent_rpcs=4096,
    )  # fmt: skip
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {listen}")
    proxy = ClusterProxy(namesrv_addrs, (advertised_host, port), credential)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(proxy, server)  # type: ignore[no-untyped-call]
    await server.start()
    ready(f"{advertised_host}:{port}")
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=0.5)
        await proxy.close()
