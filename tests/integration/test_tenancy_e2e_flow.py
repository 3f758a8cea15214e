"""Multi-tenancy end to end: a tenant made through the control plane's API produces and consumes
on a real authenticating broker, with the Orbit SDK (OAuth client credentials) and with a stock
RocketMQ client (AccessKey + SecretKey signatures); the reconciler repairs drift made directly on
the broker; a broker restarted while the control plane is down still serves authenticated clients.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from sdk import AccessKeyCredentials, Message, Producer, PushConsumer, StaticToken
from sdk.admin import AdminClient
from sdk.consumer import ConsumeFrom
from sdk.message import MessageExt
from sdk.push_consumer import ConsumeResult
from tests.integration.tenancy_cluster import (
    GROUP,
    TenancyCluster,
    Tenant,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

SCRIPT = Path(__file__).with_name("thirdparty_client_script.py")


async def produce_and_consume(
    cluster: TenancyCluster, tenant: Tenant, topic: str, group: str, creds: object, n: int, tag: str
) -> None:
    """``n`` sends with the SDK producer, then a push consumer of ``group`` gets every one once."""
    wire_topic = f"{tenant.id}%{topic}"
    async with Producer(f"{tenant.id}%producer-{tag}", namesrv_addrs=cluster.namesrv.address, credentials=creds) as p:  # type: ignore[arg-type]
        sent = {}
        for i in range(n):
            r = await p.send(Message(wire_topic, f"{tag}-{i}".encode()))
            sent[r.msg_id] = f"{tag}-{i}".encode()
    got: dict[str, bytes] = {}
    dupes: list[str] = []

    consumer = PushConsumer(
        f"{tenant.id}%{group}",
        namesrv_addrs=cluster.namesrv.address,
        credentials=creds,  # type: ignore[arg-type]
        consume_from=ConsumeFrom.FIRST_OFFSET,
        instance_name=f"consumer-{tag}",
        rebalance_interval_ms=1000,
    )
    consumer.subscribe(wire_topic)

    @consumer.on_message
    def on(msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            if m.msg_id in got:
                dupes.append(m.msg_id)
            got[m.msg_id] = bytes(m.body)
        return ConsumeResult.SUCCESS

    await consumer.start()
    try:
        await until(lambda: len(got) >= n, f"{n} messages consumed (got {len(got)})", timeout_s=20)
    finally:
        await consumer.shutdown()
    assert got == sent
    assert dupes == []


async def test_sdk_with_client_credentials_produces_and_consumes(
    tenancy: TenancyCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The producer lays its sends out from its template with the token in them (a spy counts
    # them; the broker checks each one's token as any request's).
    laid_out: list[bytes] = []
    real = Connection.invoke_frame

    def counted(self: Connection, opaque: int, code: int, head: bytes, *rest: Any) -> None:
        laid_out.append(head)
        real(self, opaque, code, head, *rest)

    monkeypatch.setattr(Connection, "invoke_frame", counted)
    acme = await tenancy.new_tenant("acme")
    topic = await tenancy.create_topic(acme, "orders")
    assert topic["status"] == "provisioning"
    # The reconciler made tenant%topic on the broker with the placed queue count.
    table = await tenancy.broker_topics()
    assert "acme%orders" in table
    assert int(table["acme%orders"]["writeQueueNums"]) == topic["queue_count"]
    reply = await tenancy.cp.call("GET", "/v1/tenants/acme/topics/orders", token=acme.token)
    assert reply.body["status"] == "active"
    await tenancy.create_group(acme, "billing")
    await produce_and_consume(tenancy, acme, "orders", "billing", acme.credentials(tenancy), 40, "sdk")
    assert len(laid_out) >= 39, "all sends but the first (route and connection unknown) laid out"
    assert all(b'"Authorization":"Bearer ' in head for head in laid_out)


# --- a stock RocketMQ client (C++ client through PyPI's rocketmq-python-cvs) --------------------
def run_stock_client(
    cluster: TenancyCluster, role: str, topic: str, group: str, *args: str, stdin: str | None = None
) -> dict[str, object]:
    logs = cluster.tmp / "clientlogs"
    logs.mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(cluster.tmp / "home"))
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-X", "faulthandler", str(SCRIPT), role, cluster.namesrv.address, topic, group]
    cmd += ["--log-dir", str(logs), *args]
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert r.returncode == 0, f"stock client {role} exited {r.returncode}; stderr:\n{r.stderr[-4000:]}"
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.skipif(
    not (sys.platform == "linux" and platform.machine() == "x86_64"),
    reason="the stock client bundles a linux x86_64 librocketmq.so",
)
async def test_stock_client_with_access_key_produces_and_consumes(tenancy: TenancyCluster) -> None:
    globex = await tenancy.new_tenant("globex")
    await tenancy.create_topic(globex, "events")
    await tenancy.create_group(globex, "audit")
    # "--name=value": a secret may begin with "-" (base64url), which argparse would take for an option.
    creds = [f"--access-key={globex.access_key}", f"--secret-key={globex.secret}"]
    specs: list[dict[str, Any]] = [{"body": f"stock-{i}", "tags": "t", "keys": f"k{i}", "props": {}} for i in range(10)]
    out = await asyncio.to_thread(
        run_stock_client, tenancy, "produce", "globex%events", "globex%stock-producer", *creds, stdin=json.dumps(specs)
    )
    results = out["results"]
    assert isinstance(results, list)
    assert [r["status"] for r in results] == [0] * 10, results
    out = await asyncio.to_thread(
        run_stock_client,
        tenancy,
        "push",
        "globex%events",
        "globex%audit",
        *creds,
        "--expect",
        "10",
        "--idle-s",
        "0.5",
    )
    msgs = out["messages"]
    assert isinstance(msgs, list)
    assert not out["timed_out"], msgs
    assert sorted(base64.b64decode(m["body_b64"]).decode() for m in msgs) == sorted(s["body"] for s in specs)
    # A wrong secret: the stock producer's sends are refused (NO_PERMISSION is not retried into success).
    wrong = globex.secret[:-1] + ("A" if globex.secret[-1] != "A" else "B")  # one character off
    bad = [f"--access-key={globex.access_key}", f"--secret-key={wrong}"]
    out = await asyncio.to_thread(
        run_stock_client,
        tenancy,
        "produce",
        "globex%events",
        "globex%stock-producer",
        *bad,
        "--allow-failures",
        stdin=json.dumps(specs[:1]),
    )
    assert out["results"] == [], out
    failures = out["failures"]
    assert isinstance(failures, list)
    assert len(failures) == 1, out
    # Nothing more was stored (the refusal itself, NO_PERMISSION with its remark, is checked on the
    # wire in test_tenancy_e2e_refusals.py).
    async with AdminClient([tenancy.namesrv.address], credentials=StaticToken(tenancy.cp.operator_token)) as admin:
        queues = await admin.describe_topic("globex%events")
    assert sum(q.max_offset for q in queues) == 10, queues


# --- drift and restarts --------------------------------------------------------------------------
async def test_reconciler_repairs_topics_changed_on_the_broker(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    topic = await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    queues = topic["queue_count"]
    op = tenancy.cp.operator_token
    # An operator deletes the topic directly on the broker ...
    resp = await tenancy.invoke(
        RemotingCommand(RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields={"topic": "acme%orders"}), token=op
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    # ... and the next round puts it back.
    await until(lambda: _has_topic(tenancy, "acme%orders", queues), "acme%orders back on the broker", timeout_s=10)
    # Changed behind the control plane's back: read-only, one queue.
    resp = await tenancy.invoke(
        RemotingCommand(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            ext_fields={
                "topic": "acme%orders",
                "defaultTopic": "TBW102",
                "readQueueNums": "1",
                "writeQueueNums": "1",
                "perm": "4",
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": "0",
                "order": "false",
            },
        ),
        token=op,
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    await until(lambda: _has_topic(tenancy, "acme%orders", queues), "acme%orders restored", timeout_s=10)
    # A deleted subscription group comes back too.
    resp = await tenancy.invoke(
        RemotingCommand(RequestCode.DELETE_SUBSCRIPTIONGROUP, ext_fields={"groupName": "acme%billing"}), token=op
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark

    async def group_back() -> bool:
        return "acme%billing" in await tenancy.broker_groups()

    await until(group_back, "acme%billing back on the broker", timeout_s=10)
    await produce_and_consume(tenancy, acme, "orders", "billing", acme.credentials(tenancy), 8, "drift")


async def _has_topic(cluster: TenancyCluster, name: str, queues: int) -> bool:
    t = (await cluster.broker_topics()).get(name)
    return (
        t is not None
        and int(t["writeQueueNums"]) == queues
        and int(t["readQueueNums"]) == queues
        and int(t["perm"]) == 6
    )


async def test_broker_restarted_while_control_plane_is_down_serves_with_last_known_state(
    tenancy: TenancyCluster,
) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    await tenancy.stop_control_plane()
    await tenancy.stop_broker()
    await tenancy.start_broker()  # the same store dir; no control plane to fetch anything from
    # A JWT issued before the outage (verified with the JWKS kept on disk) ...
    await produce_and_consume(tenancy, acme, "orders", "billing", StaticToken(acme.token), 6, "jwt")
    # ... and the access key (from the credentials kept on disk, encrypted).
    await produce_and_consume(
        tenancy, acme, "orders", "billing", AccessKeyCredentials(acme.access_key, acme.secret), 6, "ak"
    )
    # Still refused: no credentials, a wrong secret.
    resp = await tenancy.invoke(
        RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "acme%orders", "queueId": "0"})
    )
    assert resp.code == ResponseCode.NO_PERMISSION, resp.remark
    assert "no credentials" in (resp.remark or "")


async def test_the_broker_keeps_files_as_long_as_its_longest_topic_retention(tenancy: TenancyCluster) -> None:
    # Retention is per CommitLog file: a topic promised 500 h (above the broker's 72 h default)
    # raises the broker's file retention; deleting it brings the default back.
    big = await tenancy.new_tenant("bigco", plan="enterprise")
    await tenancy.create_topic(big, "archive", retention_hours=500)

    async def retention_is(hours: float) -> bool:
        info = await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO)
        return float(info["table"]["retentionHours"]) == hours

    await until(lambda: retention_is(500.0), "the broker's file retention raised to 500 h", timeout_s=10)
    reply = await tenancy.cp.call("DELETE", "/v1/tenants/bigco/topics/archive", operator=True)
    assert reply.status == 204, reply.body
    await until(lambda: retention_is(72.0), "the default retention back", timeout_s=10)


async def test_a_topic_kept_for_good_keeps_every_file_and_local_retention_reaches_the_broker(
    tenancy: TenancyCluster,
) -> None:
    big = await tenancy.new_tenant("bigco", plan="enterprise")  # the plan allows unlimited retention
    await tenancy.create_topic(big, "archive", retention_hours="unlimited", local_retention_hours=12)
    await tenancy.create_topic(big, "orders", retention_hours=500)

    async def retention_hours() -> float:
        info = await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO)
        return float(info["table"]["retentionHours"])

    async def unlimited() -> bool:
        return await retention_hours() == float("inf")

    await until(unlimited, "the broker keeping its files for good", timeout_s=10)
    # The snapshot the broker keeps on disk (it serves with it after a restart while the control
    # plane is down) holds both maps as the control plane sent them.
    state_file = tenancy.tmp / "stores" / GROUP / "config" / "tenants.json"

    def kept() -> bool:
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        return state.get("topic_retention_hours") == {"bigco%archive": None, "bigco%orders": 500} and state.get(
            "topic_local_retention_hours"
        ) == {"bigco%archive": 12}

    await until(kept, f"both retention maps in {state_file}", timeout_s=10)
    changed = await tenancy.cp.call(
        "PATCH", "/v1/tenants/bigco/topics/archive", operator=True, json={"retention_hours": 48}
    )
    assert changed.status == 200, changed.body

    async def finite() -> bool:
        return await retention_hours() == 500.0

    await until(finite, "the longest finite retention once nothing is kept for good", timeout_s=10)
