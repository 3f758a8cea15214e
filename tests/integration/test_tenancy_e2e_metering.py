"""Usage metering end to end: what a tenant does on a broker reaches the control plane's usage API
through the broker's spool and reporter — exactly once, also when a report is delivered twice,
and late but complete when the control plane was unreachable meanwhile; the messages it published
and consumed, and its requests refused over its quotas, counted one by one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import Message, protocol
from sdk.message import new_unique_ids
from tests.integration.tenancy_cluster import (
    GROUP,
    TenancyCluster,
    Tenant,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.integration.test_tenancy_e2e_refusals import pull_cmd, send_cmd
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

BODY = 1000  # bytes a send carries


async def totals(cluster: TenancyCluster, tenant: Tenant) -> dict[str, int]:
    reply = await cluster.cp.call("GET", f"/v1/tenants/{tenant.id}/usage?granularity=minute", token=tenant.token)
    assert reply.status == 200, reply.body
    return {k: int(v) for k, v in reply.body["totals"].items() if k in ("requests_4k", "bytes_in", "bytes_out")}


async def sends(cluster: TenancyCluster, tenant: Tenant, n: int) -> None:
    for _ in range(n):
        resp = await cluster.invoke(send_cmd(f"{tenant.id}%orders", b"u" * BODY), token=tenant.token)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)


def spooled_unacknowledged(store_dir: Path, tenant: str) -> dict[str, int]:
    """What the broker's usage spool holds for ``tenant`` and has not delivered yet."""
    usage = store_dir / "usage"
    state = usage / "usage.state.json"
    acked = json.loads(state.read_text()).get("acked_seq", 0) if state.exists() else 0
    out = {"requests_4k": 0, "bytes_in": 0, "bytes_out": 0}
    spool = usage / "usage.spool"
    if not spool.exists():
        return out
    for line in spool.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:  # a line being written
            continue
        if doc["seq"] > acked and doc["record"]["tenant"] == tenant:
            for k in out:
                out[k] += doc["record"][k]
    return out


async def test_usage_reaches_the_control_plane_once_and_survives_an_outage(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    # Traffic whose usage is known exactly: 20 sends of 1000 bytes (one 4 KiB unit each), one pull.
    await sends(tenancy, acme, 20)
    resp = await tenancy.invoke(pull_cmd("acme%orders", "acme%billing"), token=acme.token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    pulled = len(resp.body_bytes())
    want = {
        "requests_4k": 20 + 1 + (pulled + 4095) // 4096,  # sends; the pull; the bytes it returned
        "bytes_in": 20 * BODY,
        "bytes_out": pulled,
    }

    async def reported() -> bool:
        return await totals(tenancy, acme) == want

    await until(reported, f"usage {want} in the control plane", timeout_s=20)

    # A second delivery of the same records (what the reporter does when a 2xx is lost) is not
    # counted again.
    async with tenancy.services.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT report_id, broker, tenant_id, minute, requests_4k, bytes_in, bytes_out, stored_bytes "
            "FROM usage_records WHERE tenant_id = $1",
            "acme",
        )
    assert rows
    assert {r["broker"] for r in rows} == {GROUP}
    records: list[dict[str, Any]] = [
        {
            "report_id": r["report_id"],
            "broker": r["broker"],
            "tenant": r["tenant_id"],
            "minute": r["minute"].isoformat(),
            **{k: r[k] for k in ("requests_4k", "bytes_in", "bytes_out", "stored_bytes")},
        }
        for r in rows
    ]
    assert tenancy.broker_credentials_file is not None
    broker_cred = json.loads(tenancy.broker_credentials_file.read_text())
    broker_token = await tenancy.cp.token_for(broker_cred["access_key"], broker_cred["secret"])
    again = await tenancy.cp.call("POST", "/internal/v1/usage", token=broker_token, json={"records": records})
    assert again.status == 200, again.body
    assert again.body == {"accepted": 0, "duplicates": len(records)}
    assert await totals(tenancy, acme) == want

    # The control plane goes away; the broker keeps serving and keeps the usage in its spool.
    await tenancy.stop_control_plane()
    await sends(tenancy, acme, 30)
    store_dir = tenancy.tmp / "stores" / GROUP
    await until(
        lambda: spooled_unacknowledged(store_dir, "acme")["bytes_in"] == 30 * BODY,
        "the outage's usage spooled on the broker",
        timeout_s=15,
    )
    # Back on the same address: the spool is delivered, once.
    await tenancy.start_control_plane()
    want = {**want, "requests_4k": want["requests_4k"] + 30, "bytes_in": want["bytes_in"] + 30 * BODY}
    await until(reported, f"usage {want} after the outage", timeout_s=20)
    await until(
        lambda: spooled_unacknowledged(store_dir, "acme") == {"requests_4k": 0, "bytes_in": 0, "bytes_out": 0},
        "the spool acknowledged",
    )
    assert await totals(tenancy, acme) == want


async def test_a_meter_rolling_every_second_keys_each_period_by_its_start() -> None:
    """The broker's ``usage_roll_interval_s`` (tests use 1 s): one record per tenant and period,
    ids strictly increasing, the control plane adding a minute's periods up."""
    from data_plane.tenancy.metering import UsageMeter

    now = [1_700_000_040_000]
    meter = UsageMeter("broker-a", clock_ms=lambda: now[0], period_ms=1000)
    meter.record_request("acme", 100, 0)
    assert meter.roll(now[0] + 999) == []
    now[0] += 1000
    first = meter.roll(now[0])
    assert [(r["minute"], r["bytes_in"]) for r in first] == [(1_700_000_040_000, 100)]
    meter.record_request("acme", 50, 0)
    second = meter.roll(now[0] + 1500)
    assert [(r["report_id"], r["bytes_in"]) for r in second] == [("broker-a:1700000041000:acme", 50)]
    with pytest.raises(ValueError, match="divide a minute"):
        UsageMeter("broker-a", period_ms=7000)


async def test_messages_published_and_consumed_and_throttled_requests_reach_the_usage_api(
    tenancy: TenancyCluster,
) -> None:
    """A batch and single sends count their stored messages, a pull the messages it returned;
    every send refused over the publish quota and every pull refused over the consume quota (the
    consumed messages put the bucket in debt) counts once as a throttled request."""
    acme = await tenancy.new_tenant("acme")
    quota = {"publish_msgs_per_s": 10, "consume_msgs_per_s": 2}
    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json=quota)
    assert reply.status == 200, reply.body
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    await tenancy.reconciled(rounds=2)

    def batch_cmd() -> RemotingCommand:
        batch = [Message("acme%orders", b"b" * 100) for _ in range(3)]
        return protocol.send_batch_request(
            group="DEFAULT_PRODUCER", msgs=batch, queue_id=0, unique_ids=new_unique_ids(3),
            born_timestamp_ms=int(time.time() * 1000),
        )  # fmt: skip

    stored, refused = 0, 0

    async def send_until_refused(make: Callable[[], RemotingCommand], n: int, refusals: int) -> None:
        """Sends of ``n`` messages until the publish bucket (10 a second) refused ``refusals``."""
        nonlocal stored, refused
        deadline, until_refused = time.monotonic() + 20, refused + refusals
        while refused < until_refused:
            assert time.monotonic() < deadline, f"{stored} messages stored, no refusal: no publish quota here"
            resp = await tenancy.invoke(make(), token=acme.token)
            if resp.code == ResponseCode.SUCCESS:
                stored += n
            else:
                assert resp.code == ResponseCode.FLOW_CONTROL, (resp.code, resp.remark)
                refused += 1

    # Single sends of a tenant over its quota are refused off their frames (the early refusal),
    # batches on the command path: each refusal is counted once, whichever path made it.
    await send_until_refused(batch_cmd, 3, 1)
    await send_until_refused(lambda: send_cmd("acme%orders", b"u" * 100), 1, 3)
    await send_until_refused(batch_cmd, 3, 1)
    info = (await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    on_command_path, early = int(info["quotaRefusals"]), int(info["quotaEarlyRefusals"])
    assert (on_command_path >= 2, early >= 1) == (True, True), info
    assert on_command_path + early == refused
    resp = await tenancy.invoke(pull_cmd("acme%orders", "acme%billing"), token=acme.token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    pulled = len(protocol.decode_messages(resp.body_bytes(), GROUP))
    assert pulled == min(stored, 32)  # well over the consume bucket's 2: it is in debt now
    again = await tenancy.invoke(pull_cmd("acme%orders", "acme%billing"), token=acme.token)
    assert again.code == ResponseCode.FLOW_CONTROL, (again.code, again.remark)
    want = {"messages_in": stored, "messages_out": pulled, "throttled_requests": refused + 1}

    async def counted() -> dict[str, int]:
        reply = await tenancy.cp.call("GET", "/v1/tenants/acme/usage?granularity=minute", token=acme.token)
        assert reply.status == 200, reply.body
        return {k: int(reply.body["totals"][k]) for k in want}

    async def reported() -> bool:
        return await counted() == want

    await until(reported, f"usage {want} in the control plane", timeout_s=20)
