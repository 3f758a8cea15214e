"""A gRPC client as the broker's handlers see a connection: the send handler reads its peer and
keeps per-client notes in ``attrs``; the transaction check service reaches a producer through
``invoke_oneway``, which here becomes a RecoverOrphanedTransactionCommand on the client's
Telemetry stream."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from data_plane.proxy.messages import to_message
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import RecordError, decode_record

log = logging.getLogger(__name__)


class GrpcConnection:
    __slots__ = (
        "__weakref__",
        "attrs",
        "closed",
        "groups",
        "key",
        "peer",
        "producer_topics",
        "seen",
        "share",
        "telemetry",
        "tenant_load",
    )  # fmt: skip

    def __init__(self, key: str, peer: str) -> None:
        self.key = key
        self.peer = peer
        self.attrs: dict[str, Any] = {}
        self.closed = False
        self.seen = time.monotonic()
        self.telemetry: asyncio.Queue[rpc.TelemetryCommand | None] | None = None
        self.groups: set[str] = set()
        self.producer_topics: set[str] = set()
        self.share = None
        self.tenant_load = None

    def park(self) -> None:
        pass

    def unpark(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def invoke_oneway(self, cmd: RemotingCommand) -> bool:
        """A transaction check-back for this producer, sent on its Telemetry stream."""
        outbox = self.telemetry
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE or outbox is None or self.closed:
            return False
        ext = cmd.ext_fields or {}
        try:
            rec = decode_record(cmd.body_bytes(), check_crc=False)
        except (RecordError, ValueError):
            return False
        command = rpc.TelemetryCommand()
        command.recover_orphaned_transaction_command.message.CopyFrom(to_message(rec))
        command.recover_orphaned_transaction_command.transaction_id = ext.get("offsetMsgId", "")
        try:
            outbox.put_nowait(command)
        except asyncio.QueueFull:
            return False
        return True
