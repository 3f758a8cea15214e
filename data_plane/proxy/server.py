"""The broker's gRPC endpoint: ``MessagingService`` on its own port, served by Orbit's own HTTP/2
(``data_plane.http2.grpc_server``), with bounds on what a peer may send (message size,
concurrent streams, metadata, connections) and TLS when the broker has it.

grpcio's server is not used here: its asyncio bridge caps a process at about 3,000 calls a second
on this class of machine (``python -m benchmarks.grpc_ceiling``), below what the endpoint must
carry; the protocol it speaks is the same, and grpcio's own client is among the suite's clients.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from data_plane.http2.grpc_server import GrpcServer
from data_plane.proxy.service import MessagingService
from data_plane.proxy.v2 import service_pb2 as rpc

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker

log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS = 256
MAX_METADATA_BYTES = 16 * 1024
# A SendMessage call carries at most 64 messages; leave room for one of the largest bodies.
FRAME_SLACK_BYTES = 1 << 20


class GrpcEndpoint:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.server: GrpcServer | None = None
        self.port = 0
        self.service: MessagingService | None = None

    async def bind(self) -> int:
        """Listens on ``grpc_listen``; calls are taken once ``start`` has named the endpoint."""
        cfg = self.broker.config
        store = self.broker.store
        max_body = store.config.max_message_size_bytes if store is not None else 4 << 20
        limit = max(4 << 20, max_body * 4) + FRAME_SLACK_BYTES
        tls = cfg.server_tls
        self.service = MessagingService(self.broker, advertised=("", 0))
        self.server = GrpcServer(
            self.service,
            rpc.DESCRIPTOR.services_by_name["MessagingService"],
            max_message_bytes=limit,
            max_metadata_bytes=MAX_METADATA_BYTES,
            max_concurrent_streams=MAX_CONCURRENT_STREAMS,
            ssl_context=tls.context() if tls is not None else None,
            # What a call appended is in the CommitLog file before its answer leaves (as the
            # remoting server's before_write does): a kill -9 after the answer loses none of it.
            before_write=store.write_staged if store is not None else None,
        )
        host, _, port = cfg.grpc_listen.rpartition(":")
        try:
            self.port = await self.server.listen(host.strip("[]") or "0.0.0.0", int(port))
        except OSError as e:
            raise OSError(f"cannot listen for gRPC on {cfg.grpc_listen}: {e.strerror or e}") from None
        return self.port

    async def start(self, advertised_host: str) -> None:
        assert self.service is not None
        self.service.advertised = (advertised_host, self.port)
        log.info("RocketMQ 5 gRPC endpoint serving on %s:%d", advertised_host, self.port)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close(grace=0.5)
            self.server = None
