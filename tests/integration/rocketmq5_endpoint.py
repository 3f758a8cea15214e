"""A broker process with its RocketMQ 5 gRPC endpoint, for the official clients' tests: admin
calls over its remoting port (topics, groups, offsets) and the clients' roles against it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from tests import rocketmq5_client as v5
from tests.integration.conftest import ServerProcess

GRPC = ["--set", "grpc_listen=127.0.0.1:0", "--set", "enable_property_filter=true",
        "--set", "transaction_timeout_ms=1000", "--set", "transaction_check_scan_interval_ms=200"]  # fmt: skip


class Endpoint:
    """A broker with its gRPC endpoint, and admin calls over its remoting port."""

    def __init__(self, proc: ServerProcess, home: Path) -> None:
        self.proc = proc
        self.home = home

    @property
    def grpc(self) -> str:
        return str(self.proc.info["grpc_address"])

    async def admin(self, code: int, ext: dict[str, str] | None = None, body: bytes | None = None) -> RemotingCommand:
        client = RemotingClient()
        try:
            r = await client.invoke(self.proc.address, RemotingCommand(code, ext_fields=ext, body=body), 5000)
        finally:
            await client.close()
        return r

    async def topic(self, name: str, queues: int = 4) -> None:
        r = await self.admin(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": name, "defaultTopic": "TBW102", "readQueueNums": str(queues), "writeQueueNums": str(queues),
            "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})  # fmt: skip
        assert r.code == ResponseCode.SUCCESS, r.remark

    async def group(self, name: str, **conf: Any) -> None:
        body = bodies.dumps({"groupName": name, **conf})
        r = await self.admin(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        assert r.code == ResponseCode.SUCCESS, r.remark

    async def max_offset(self, topic: str, queue_id: int = 0) -> int:
        r = await self.admin(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})
        return int((r.ext_fields or {}).get("offset", "-1")) if r.code == ResponseCode.SUCCESS else -1

    def run(self, role: str, **args: Any) -> dict[str, Any]:
        return v5.run(role, {"endpoint": self.grpc, **args}, home=self.home)

    def run_node(self, role: str, **args: Any) -> dict[str, Any]:
        return v5.run_node(role, {"endpoint": self.grpc, **args}, home=self.home)


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"T{tag}", f"G{tag}"
