"""The broker's gRPC endpoint: ``MessagingService`` on its own port, with bounds on what a
peer may send (message size, concurrent streams, metadata) and TLS when the broker has it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from data_plane.proxy.service import MessagingService
from data_plane.proxy.v2 import service_pb2_grpc

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
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.service: MessagingService | None = None

    async def bind(self) -> int:
        cfg = self.broker.config
        store = self.broker.store
        max_body = store.config.max_message_size_bytes if store is not None else 4 << 20
        limit = max(4 << 20, max_body * 4) + FRAME_SLACK_BYTES
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
                ("grpc.max_metadata_size", MAX_METADATA_BYTES),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=4096,
        )
        tls = cfg.server_tls
        try:
            if tls is not None and tls.mode != "disabled":
                key = Path(tls.key_file).read_bytes()  # noqa: ASYNC240 - once, as the broker starts
                chain = Path(tls.cert_file).read_bytes()  # noqa: ASYNC240
                creds = grpc.ssl_server_credentials([(key, chain)])
                self.port = self.server.add_secure_port(cfg.grpc_listen, creds)
            else:
                self.port = self.server.add_insecure_port(cfg.grpc_listen)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot listen for gRPC on {cfg.grpc_listen}: address already in use, or not this host's")
        return self.port

    async def start(self, advertised_host: str) -> None:
        assert self.server is not None
        self.service = MessagingService(self.broker, advertised=(advertised_host, self.port))
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, self.server)  # type: ignore[no-untyped-call]
        await self.server.start()
        log.info("RocketMQ 5 gRPC endpoint serving on %s:%d", advertised_host, self.port)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=0.5)
            self.server = None
