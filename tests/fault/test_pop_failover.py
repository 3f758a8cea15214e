"""Lease-based (POP) consumption through a failover: kill -9 of a SYNC_MASTER while RocketMQ 5
clients hold leases. The lease journal lives in the CommitLog, so the promoted slave has it:
no acknowledged message is handed out again, the leased ones come back only once their lease
ends (with their attempt counted), and none is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import rocketmq5_client as v5
from tests.fault.ha_group import new_group
from tests.integration.conftest import ServerProcess
from tests.postgres_fixture import ControlPlaneHarness

pytestmark = [pytest.mark.fault, pytest.mark.asyncio]

TOPIC = "PopHa"
GROUP = "pop-ha-readers"


async def test_sync_master_failover_keeps_leases_and_acknowledgements(
    control_plane: ControlPlaneHarness, namesrv: ServerProcess, start_broker: Callable[..., ServerProcess],
    tmp_path: Path,
) -> None:  # fmt: skip
    v5.client_python()
    group = await new_group(
        control_plane, namesrv, start_broker, tmp_path, role="SYNC_MASTER", flush="ASYNC_FLUSH",
        extra=("--set", "grpc_listen=127.0.0.1:0"),
    )  # fmt: skip
    home = tmp_path / "client-home"
    try:
        assert group.admin is not None
        await group.admin.create_topic(TOPIC, queue_nums=2)
        master = group.members[0].info["grpc_address"]

        async def run(endpoint: str, role: str, **args: Any) -> dict[str, Any]:
            # In a thread: the control plane serving the group's heartbeats runs on this loop.
            args = {"endpoint": endpoint, "topic": TOPIC, "group": GROUP, **args}
            return await asyncio.to_thread(v5.run, role, args, home=home)

        sent = (await run(master, "produce", messages=[{"body": f"m{i}"} for i in range(30)]))["sent"]
        assert len(sent) == 30
        acked = (await run(master, "simple", count=12, invisible_s=60))["received"]
        leased = (await run(master, "simple", count=8, invisible_s=6, ack=False, crash=True))["received"]
        assert (len(acked), len(leased)) == (12, 8)
        await group.wait_in_sync(1)
        group.members[0].kill()
        await group.wait_role(1, "SYNC_MASTER", timeout_s=30)
        # A SYNC_MASTER answers an acknowledgement once a slave holds its record: the old master
        # comes back as the new one's slave first (alone, it would answer SLAVE_NOT_AVAILABLE).
        await group.start(0)
        await group.wait_role(0, "SLAVE")
        promoted = group.members[1].info["grpc_address"]
        got = (await run(promoted, "simple", count=18, invisible_s=60, timeout_s=40, await_s=5))["received"]
        bodies = sorted(m["body"] for m in got)
        acked_bodies = {m["body"] for m in acked}
        leased_bodies = {m["body"] for m in leased}
        # None lost: every message not acknowledged before the kill arrives; none acknowledged does.
        assert bodies == sorted({f"m{i}" for i in range(30)} - acked_bodies)
        assert not acked_bodies & set(bodies)
        # The leased ones come back with their attempt counted, not before their lease ended.
        again = [m for m in got if m["body"] in leased_bodies]
        assert len(again) == 8
        assert all(m["attempt"] == 2 for m in again)
        assert min(m["at"] for m in again) >= min(m["at"] for m in leased) + 6 - 0.5
    finally:
        if group.admin is not None:
            await group.admin.close()
