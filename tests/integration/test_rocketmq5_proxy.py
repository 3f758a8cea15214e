"""``orbit proxy`` (cluster mode): the official RocketMQ 5 Python client talks to one proxy in
front of two brokers. Sends spread over both brokers, receives and acknowledgements reach the
broker that leased each message, a PushConsumer gets every queue of both, and a transaction's
check-back from a broker reaches the producer through the proxy and its answer goes back."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdk.admin import AdminClient
from tests import rocketmq5_client as v5
from tests.integration.conftest import ServerProcess, spawn
from tests.integration.helpers import until
from tests.integration.rocketmq5_endpoint import GRPC, Endpoint, names

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_the_proxy_fronts_two_brokers_for_the_official_client(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], processes: list[ServerProcess], tmp_path: Path
) -> None:
    v5.client_python()
    a = Endpoint(start_broker(namesrv.address, *GRPC, name="broker-a"), tmp_path / "home")
    b = Endpoint(start_broker(namesrv.address, *GRPC, name="broker-b"), tmp_path / "home")
    proxy = spawn("proxy", ["--listen", "127.0.0.1:0", "--namesrv", namesrv.address], tmp_path / "run")
    processes.append(proxy)
    topic, group = names()
    admin = AdminClient(namesrv.address)
    try:
        await until(lambda: _registered(admin, 2), "both brokers registered")
        await admin.create_topic(topic, queue_nums=2)
        for e in (a, b):
            await e.group(group)
            await e.group(group + "-push")
    finally:
        await admin.close()
    home = tmp_path / "home"

    def run(role: str, **args: Any) -> dict[str, Any]:
        return v5.run(role, {"endpoint": proxy.address, "topic": topic, **args}, home=home)

    sent = run("produce", messages=[{"body": f"m{i}"} for i in range(12)])["sent"]
    assert len(sent) == 12
    stored = [sum([await e.max_offset(topic, q) for q in range(2)]) for e in (a, b)]
    assert sum(stored) == 12
    assert min(stored) > 0, f"the proxy sent to one broker only: {stored}"

    got = run("simple", group=group, count=12, timeout_s=20)
    assert sorted(m["body"] for m in got["received"]) == sorted(f"m{i}" for i in range(12))
    assert run("simple", group=group, count=1, timeout_s=3, await_s=1)["received"] == []  # acknowledged, on both

    pushed = run("push", group=group + "-push", count=12, fail_first=1, timeout_s=40)["consumed"]
    attempts: dict[str, list[int]] = defaultdict(list)
    for m in pushed:
        attempts[m["body"]].append(m["attempt"])
    assert sorted(attempts) == sorted(f"m{i}" for i in range(12))
    assert all(x[:2] == [1, 2] for x in attempts.values()), attempts

    specs = [{"body": "checked", "resolution": "none"}, {"body": "ok", "resolution": "commit"}]
    tx = run("transaction", messages=specs, check="commit", check_wait_s=20)
    assert tx["checked"] == [tx["sent"][0]["message_id"]]
    # The client picks a random queue for each receive, so short polls over a generous deadline
    # reach both brokers however the picks fall; the loop ends as soon as both arrived.
    after = run("simple", group=group, count=2, timeout_s=30, await_s=1)
    assert sorted(m["body"] for m in after["received"]) == ["checked", "ok"]


async def _registered(admin: AdminClient, n: int) -> bool:
    return len(await admin.master_addrs()) >= n
