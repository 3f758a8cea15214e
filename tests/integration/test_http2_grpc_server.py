"""GrpcServer (data_plane/http2/grpc_server.py) in process on 127.0.0.1, called by grpcio's asyncio
client and by Orbit's own GrpcChannel (data_plane/http2/grpc_client.py): unary calls with their
metadata and peer seen by the handler; a server stream many times the initial 65,535-byte windows
arriving whole (flow control); a bidirectional stream echoed message by message; 200 calls at once
on one connection; the refusals as gRPC statuses (an unknown method or service UNIMPLEMENTED, a
message above ``max_message_bytes`` or metadata above ``max_metadata_bytes`` RESOURCE_EXHAUSTED with
the connection still serving, a handler's exception UNKNOWN, a passed deadline DEADLINE_EXCEEDED with
the handler cancelled); ``GrpcServer.close`` ending the connections open on it, after the grace
given to calls in flight. And GrpcChannel's own side: it connects knowing the server's stream limit
(calls started at once do not fail against a guess of it), refuses a server that hangs up before
its SETTINGS, and refuses an answer above its limit with RESOURCE_EXHAUSTED."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import Message

from data_plane.http2.grpc_client import GrpcChannel
from data_plane.http2.grpc_server import (
    DEADLINE_EXCEEDED,
    OK,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    UNIMPLEMENTED,
    UNKNOWN,
    CallContext,
    CallError,
    Framed,
    GrpcServer,
    framed,
)
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc

pytestmark = [pytest.mark.asyncio]

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
PREFIX = "/apache.rocketmq.v2.MessagingService/"
MAX_MESSAGE = 256 * 1024
DEADLINE_S = 10.0
M = TypeVar("M", bound=Message)


class Servicer(service_pb2_grpc.MessagingServiceServicer):
    """QueryRoute echoes, ReceiveMessage streams ``bodies``, Telemetry echoes, SendMessage fails,
    Heartbeat waits for ever (counting the waits that ended in ``hangs_ended``)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.hanging = 0
        self.hangs_ended = 0

    async def QueryRoute(self, request: rpc.QueryRouteRequest, context: CallContext) -> rpc.QueryRouteResponse:
        metadata = ",".join(f"{k}={v}" for k, v in context.invocation_metadata() if k.startswith("x-"))
        text = f"{request.topic.name}|{context.peer()}|{metadata}"
        return rpc.QueryRouteResponse(status=pb.Status(code=pb.Code.OK, message=text))

    async def ReceiveMessage(
        self, request: rpc.ReceiveMessageRequest, context: CallContext
    ) -> AsyncIterator[rpc.ReceiveMessageResponse | Framed]:
        bodies = self.bodies[: request.batch_size]
        if request.message_queue.id == 1:  # all but the last framed together, then the last alone
            whole = [framed(rpc.ReceiveMessageResponse(message=pb.Message(body=b)).SerializeToString()) for b in bodies]
            yield Framed(b"".join(whole[:-1]))
            bodies = bodies[-1:]
        for body in bodies:
            yield rpc.ReceiveMessageResponse(message=pb.Message(body=body))

    raw_requests = frozenset({"QueryAssignment"})

    async def QueryAssignment(self, request: bytes, context: CallContext) -> rpc.QueryAssignmentResponse:
        """Handed its request's bytes: says what they were, parsed by itself."""
        assert type(request) is bytes
        topic = rpc.QueryAssignmentRequest.FromString(request).topic.name
        return rpc.QueryAssignmentResponse(status=pb.Status(code=pb.Code.OK, message=f"{len(request)}:{topic}"))

    async def Telemetry(
        self, request_iterator: AsyncIterator[rpc.TelemetryCommand], context: CallContext
    ) -> AsyncIterator[rpc.TelemetryCommand]:
        async for command in request_iterator:
            yield command

    async def SendMessage(self, request: rpc.SendMessageRequest, context: CallContext) -> rpc.SendMessageResponse:
        raise RuntimeError("the handler failed on purpose")

    async def Heartbeat(self, request: rpc.HeartbeatRequest, context: CallContext) -> rpc.HeartbeatResponse:
        self.hanging += 1
        try:
            await asyncio.Event().wait()  # never set
        finally:
            self.hangs_ended += 1
        return rpc.HeartbeatResponse()


@dataclass
class Served:
    server: GrpcServer
    port: int
    servicer: Servicer


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    servicer = Servicer()
    server = GrpcServer(servicer, SERVICE, max_message_bytes=MAX_MESSAGE)
    port = await server.listen("127.0.0.1", 0)
    try:
        yield Served(server, port, servicer)
    finally:
        await server.close(grace=0)


async def poll(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not check():
        assert loop.time() < end, what
        await asyncio.sleep(0.005)


# --- the two clients behind one face -------------------------------------------------------------------
class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Client:
    name = ""

    async def unary(
        self,
        path: str,
        request: Message,
        answer: type[M],
        metadata: Sequence[tuple[str, str]] = (),
        deadline_s: float = 0,
    ) -> M:
        raise NotImplementedError

    async def stream(self, path: str, request: Message, answer: type[M]) -> list[M]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class GrpcioClient(Client):
    name = "grpcio"

    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    async def unary(
        self,
        path: str,
        request: Message,
        answer: type[M],
        metadata: Sequence[tuple[str, str]] = (),
        deadline_s: float = 0,
    ) -> M:
        call = self.channel.unary_unary(
            path, request_serializer=type(request).SerializeToString, response_deserializer=answer.FromString
        )
        try:
            response: M = await call(request, metadata=tuple(metadata), timeout=deadline_s or None)
        except grpc.aio.AioRpcError as e:
            raise Refused(e.code().value[0], e.details() or "") from None
        return response

    async def stream(self, path: str, request: Message, answer: type[M]) -> list[M]:
        call = self.channel.unary_stream(
            path, request_serializer=type(request).SerializeToString, response_deserializer=answer.FromString
        )
        try:
            return [m async for m in call(request)]
        except grpc.aio.AioRpcError as e:
            raise Refused(e.code().value[0], e.details() or "") from None

    async def close(self) -> None:
        await self.channel.close()


class OrbitClient(Client):
    name = "GrpcChannel"

    def __init__(self, channel: GrpcChannel) -> None:
        self.channel = channel

    def _on(self, path: str) -> tuple[GrpcChannel, str]:
        service, _, method = path[1:].rpartition("/")
        if service == self.channel.service:
            return self.channel, method
        return GrpcChannel(self.channel.conn, service), method

    async def unary(
        self,
        path: str,
        request: Message,
        answer: type[M],
        metadata: Sequence[tuple[str, str]] = (),
        deadline_s: float = 0,
    ) -> M:
        pairs = list(metadata)
        if deadline_s:
            pairs.append(("grpc-timeout", f"{round(deadline_s * 1000)}m"))
        channel, method = self._on(path)
        try:
            return await channel.unary(method, request, answer, GrpcChannel.metadata(pairs))
        except CallError as e:
            raise Refused(e.code, e.message) from None

    async def stream(self, path: str, request: Message, answer: type[M]) -> list[M]:
        channel, method = self._on(path)
        try:
            return await channel.server_stream(method, request, answer)
        except CallError as e:
            raise Refused(e.code, e.message) from None

    async def close(self) -> None:
        self.channel.close()


@pytest_asyncio.fixture(params=["grpcio", "GrpcChannel"])
async def client(request: pytest.FixtureRequest, served: Served) -> AsyncIterator[Client]:
    c: Client
    if request.param == "grpcio":
        c = GrpcioClient(served.port)
    else:
        c = OrbitClient(await GrpcChannel.connect("127.0.0.1", served.port))
    try:
        yield c
    finally:
        await c.close()


def route(topic: str) -> rpc.QueryRouteRequest:
    return rpc.QueryRouteRequest(topic=pb.Resource(name=topic))


async def query_route(client: Client, topic: str, metadata: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The handler's echo: [topic, peer, x- metadata]."""
    answer = await client.unary(PREFIX + "QueryRoute", route(topic), rpc.QueryRouteResponse, metadata)
    assert answer.status.code == pb.Code.OK
    return answer.status.message.split("|")


# --- calls ------------------------------------------------------------------------------------------
async def test_a_unary_call_is_answered_and_its_metadata_reaches_the_handler(client: Client) -> None:
    topic, _peer, metadata = await query_route(client, "orders", [("x-one", "1"), ("x-two", "zwei drei")])
    assert topic == "orders"
    assert metadata == "x-one=1,x-two=zwei drei"


async def test_the_handler_sees_its_peer_as_ipv4_address_and_port(client: Client, served: Served) -> None:
    _topic, peer, _metadata = await query_route(client, "t")
    assert re.fullmatch(r"ipv4:127\.0\.0\.1:[0-9]+", peer), peer
    port = int(peer.rpartition(":")[2])
    assert port != served.port
    if isinstance(client, OrbitClient):
        assert client.channel.conn.transport is not None
        assert port == client.channel.conn.transport.get_extra_info("sockname")[1]
    assert peer in {c.peer_label for c in served.server.connections}


async def test_a_server_stream_far_above_the_initial_windows_arrives_whole(
    client: Client, served: Served, seed: int
) -> None:
    rng = random.Random(seed)
    # 60 messages of 100 KiB: 6 MiB, far beyond 65,535 bytes (and GrpcChannel's 4 MiB stream window).
    served.servicer.bodies = [rng.randbytes(100 * 1024) for _ in range(60)]
    answers = await client.stream(
        PREFIX + "ReceiveMessage", rpc.ReceiveMessageRequest(batch_size=60), rpc.ReceiveMessageResponse
    )
    assert [a.message.body for a in answers] == served.servicer.bodies


async def test_answers_a_handler_yields_framed_together_arrive_one_by_one_in_order(
    client: Client, served: Served, seed: int
) -> None:
    rng = random.Random(seed)
    served.servicer.bodies = [rng.randbytes(rng.randrange(0, 40_000)) for _ in range(12)]
    request = rpc.ReceiveMessageRequest(batch_size=12, message_queue=pb.MessageQueue(id=1))
    answers = await client.stream(PREFIX + "ReceiveMessage", request, rpc.ReceiveMessageResponse)
    assert [a.message.body for a in answers] == served.servicer.bodies


async def test_a_method_named_in_raw_requests_is_handed_the_requests_bytes(client: Client) -> None:
    request = rpc.QueryAssignmentRequest(topic=pb.Resource(name="orders"))
    answer = await client.unary(PREFIX + "QueryAssignment", request, rpc.QueryAssignmentResponse)
    assert answer.status.message == f"{request.ByteSize()}:orders"


async def test_a_server_stream_of_no_messages_ends_with_ok(client: Client) -> None:
    answers = await client.stream(
        PREFIX + "ReceiveMessage", rpc.ReceiveMessageRequest(batch_size=0), rpc.ReceiveMessageResponse
    )
    assert answers == []


async def test_200_concurrent_unary_calls_share_one_connection(client: Client, served: Served) -> None:
    answers = await asyncio.gather(*(query_route(client, f"topic-{i}") for i in range(200)))
    assert [a[0] for a in answers] == [f"topic-{i}" for i in range(200)]
    assert len(served.server.connections) == 1


async def test_grpc_channel_connects_knowing_the_servers_stream_limit(served: Served) -> None:
    channel = await GrpcChannel.connect("127.0.0.1", served.port)
    try:
        assert channel.conn.peer_max_streams == served.server.max_concurrent_streams
        # Started in the same turn as connect returned: none waits for SETTINGS to arrive first.
        calls = [channel.conn.call(PREFIX + "QueryRoute", route(f"t{i}").SerializeToString(), b"") for i in range(200)]
        answers = [rpc.QueryRouteResponse.FromString((await c)[0]) for c in calls]
        assert [a.status.message.split("|")[0] for a in answers] == [f"t{i}" for i in range(200)]
    finally:
        channel.close()


async def test_grpc_channel_refuses_a_server_that_closes_before_its_settings() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        with pytest.raises(CallError) as refused:
            await GrpcChannel.connect("127.0.0.1", server.sockets[0].getsockname()[1])
        assert refused.value.code == UNAVAILABLE
    finally:
        server.close()
        await server.wait_closed()


async def test_a_bidirectional_stream_echoes_each_message_before_the_next_is_sent(served: Served, seed: int) -> None:
    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Telemetry()
        # 30 commands of up to 100 KiB upward: beyond the server's 1 MiB stream window as well.
        for i in range(30):
            command = rpc.TelemetryCommand(
                status=pb.Status(code=pb.Code.OK, message=f"{i}:" + "x" * rng.randrange(100 * 1024))
            )
            await call.write(command)
            assert await call.read() == command
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


# --- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [PREFIX + "Nope", "/other.Service/QueryRoute"])
async def test_an_unknown_method_or_service_is_unimplemented(client: Client, path: str) -> None:
    with pytest.raises(Refused) as refused:
        await client.unary(path, route("t"), rpc.QueryRouteResponse)
    assert refused.value.code == UNIMPLEMENTED
    assert (await query_route(client, "after"))[0] == "after"


async def test_a_message_above_the_limit_is_resource_exhausted_and_the_connection_goes_on(
    client: Client, served: Served
) -> None:
    with pytest.raises(Refused) as refused:
        await client.unary(PREFIX + "QueryRoute", route("x" * (MAX_MESSAGE + 1)), rpc.QueryRouteResponse)
    assert refused.value.code == RESOURCE_EXHAUSTED
    connections = set(served.server.connections)
    assert len(connections) == 1
    assert (await query_route(client, "after"))[0] == "after"
    assert served.server.connections == connections  # the same connection answered


async def test_a_message_just_at_the_limit_is_taken(client: Client) -> None:
    n = MAX_MESSAGE
    while len(route("x" * n).SerializeToString()) > MAX_MESSAGE:
        n -= 1
    request = route("x" * n)
    assert len(request.SerializeToString()) == MAX_MESSAGE
    answer = await client.unary(PREFIX + "QueryRoute", request, rpc.QueryRouteResponse)
    assert answer.status.message.startswith("xxx")


async def test_metadata_above_16_kib_is_resource_exhausted_and_the_connection_goes_on(client: Client) -> None:
    with pytest.raises(Refused) as refused:
        await query_route(client, "t", [("x-big", "v" * (17 * 1024))])
    assert refused.value.code == RESOURCE_EXHAUSTED
    assert (await query_route(client, "after", [("x-small", "v" * 1024)]))[0] == "after"


async def test_a_handler_exception_is_unknown(client: Client) -> None:
    with pytest.raises(Refused) as refused:
        await client.unary(PREFIX + "SendMessage", rpc.SendMessageRequest(), rpc.SendMessageResponse)
    assert refused.value.code == UNKNOWN
    assert "the handler failed on purpose" not in refused.value.message  # (not shown to the caller)


async def test_a_passed_deadline_is_deadline_exceeded_and_the_handler_is_cancelled(
    client: Client, served: Served
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(Refused) as refused:
        await client.unary(PREFIX + "Heartbeat", rpc.HeartbeatRequest(), rpc.HeartbeatResponse, deadline_s=0.2)
    assert refused.value.code == DEADLINE_EXCEEDED
    assert loop.time() - start >= 0.19
    assert served.servicer.hanging == 1
    await poll(lambda: served.servicer.hangs_ended == 1, "the handler was cancelled")
    await poll(lambda: all(not c.streams for c in served.server.connections), "the call's stream is forgotten")
    assert (await query_route(client, "after"))[0] == "after"


async def test_grpc_channel_refuses_an_answer_above_its_limit_and_goes_on(served: Served) -> None:
    served.servicer.bodies = [b"b" * 2000]
    channel = await GrpcChannel.connect("127.0.0.1", served.port, max_message_bytes=1000)
    try:
        with pytest.raises(CallError) as refused:
            await channel.server_stream(
                "ReceiveMessage", rpc.ReceiveMessageRequest(batch_size=1), rpc.ReceiveMessageResponse
            )
        assert refused.value.code == RESOURCE_EXHAUSTED
        assert not channel.conn.streams
        answer = await channel.unary("QueryRoute", route("after"), rpc.QueryRouteResponse)
        assert answer.status.message.startswith("after|")
        await poll(lambda: all(not c.streams for c in served.server.connections), "the server forgot the call")
    finally:
        channel.close()


# --- closing ----------------------------------------------------------------------------------------
async def test_closing_the_server_ends_its_connections_and_cancels_their_calls(served: Served) -> None:
    orbit = await GrpcChannel.connect("127.0.0.1", served.port)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        assert (await stub.QueryRoute(route("t"))).status.code == pb.Code.OK
        hung = asyncio.ensure_future(orbit.unary("Heartbeat", rpc.HeartbeatRequest(), rpc.HeartbeatResponse))
        await poll(lambda: served.servicer.hanging == 1, "the call reached its handler")
        assert len(served.server.connections) == 2
        await served.server.close(grace=0.05)
        with pytest.raises(CallError) as failed:
            await hung
        assert failed.value.code == UNAVAILABLE
        await poll(lambda: orbit.conn.closed, "GrpcChannel's connection ended")
        await poll(lambda: served.servicer.hangs_ended == 1, "the handler was cancelled")
        assert not served.server.connections
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.QueryRoute(route("t"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_closing_server_lets_calls_in_flight_finish_within_the_grace(served: Served) -> None:
    orbit = await GrpcChannel.connect("127.0.0.1", served.port)
    try:
        served.servicer.bodies = [b"b" * 1000] * 3
        answers = asyncio.ensure_future(
            orbit.server_stream("ReceiveMessage", rpc.ReceiveMessageRequest(batch_size=3), rpc.ReceiveMessageResponse)
        )
        await poll(lambda: any(c.last_id for c in served.server.connections), "the call arrived")
        await served.server.close(grace=2)
        assert [a.message.body for a in await answers] == served.servicer.bodies
        with pytest.raises(CallError):
            await orbit.unary("QueryRoute", route("t"), rpc.QueryRouteResponse)
    finally:
        orbit.close()


async def test_the_status_codes_are_grpcs() -> None:
    names: dict[int, Any] = {c.value[0]: c for c in grpc.StatusCode}
    assert names[OK] == grpc.StatusCode.OK
    assert names[UNIMPLEMENTED] == grpc.StatusCode.UNIMPLEMENTED
    assert names[RESOURCE_EXHAUSTED] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert names[DEADLINE_EXCEEDED] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert names[UNKNOWN] == grpc.StatusCode.UNKNOWN
    assert names[UNAVAILABLE] == grpc.StatusCode.UNAVAILABLE
