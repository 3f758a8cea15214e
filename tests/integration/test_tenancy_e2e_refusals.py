"""What an authenticating broker refuses, seen on the wire: every refusal is NO_PERMISSION (16)
with a remark that says why (a tenant past its connection limit: SYSTEM_BUSY). Tokens come from
the real control plane (or are forged here against its real keys); revocation and suspension go
through the control plane's API and reach the broker through the reconciler."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from control_plane.sealing import Sealer
from control_plane.services.tokens import TokenService
from data_plane.auth.signature import ACCESS_KEY, ONS_CHANNEL, SIGNATURE, sign
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import protocol
from sdk.message import Message, MessageQueue, new_unique_id
from tests.integration.tenancy_cluster import (
    GROUP,
    TenancyCluster,
    Tenant,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

# A revoked credential or a suspended tenant must be refused within this long (the issue: one
# minute; the reconciler runs every 0.5 s here and at once after the API change).
PROPAGATION_S = 10.0


def send_cmd(topic: str, body: bytes = b"hello") -> RemotingCommand:
    return protocol.send_request(
        group="DEFAULT_PRODUCER",
        msg=Message(topic, body),
        queue_id=0,
        unique_id=new_unique_id(),
        born_timestamp_ms=int(time.time() * 1000),
    )


def pull_cmd(topic: str, group: str) -> RemotingCommand:
    return protocol.pull_request(
        group=group,
        mq=MessageQueue(topic, GROUP, 0),
        offset=0,
        max_nums=32,
        subscription="*",
        sub_version=0,
        suspend_timeout_ms=0,
        suspend=False,
    )


def offset_cmd(topic: str, group: str) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.QUERY_CONSUMER_OFFSET, ext_fields={"consumerGroup": group, "topic": topic, "queueId": "0"}
    )


def signed(cmd: RemotingCommand, access_key: str, secret: str) -> RemotingCommand:
    """Signed as the stock C++ client does: AccessKey and OnsChannel join the signed fields."""
    ext = {**(cmd.ext_fields or {}), ACCESS_KEY: access_key, ONS_CHANNEL: "ALIYUN"}
    ext[SIGNATURE] = sign(ext, cmd.body_bytes(), secret)
    cmd.ext_fields = ext
    return cmd


async def refused(cluster: TenancyCluster, cmd: RemotingCommand, remark: str, *, token: str | None = None) -> None:
    resp = await cluster.invoke(cmd, token=token)
    assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
    assert remark in (resp.remark or ""), resp.remark


async def accepted(cluster: TenancyCluster, cmd: RemotingCommand, *, token: str | None = None) -> None:
    resp = await cluster.invoke(cmd, token=token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)


def _b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(doc)).rstrip(b"=").decode()


async def two_tenants(cluster: TenancyCluster) -> tuple[Tenant, Tenant]:
    acme = await cluster.new_tenant("acme")
    beta = await cluster.new_tenant("beta")
    for t in (acme, beta):
        await cluster.create_topic(t, "orders")
        await cluster.create_group(t, "billing")
    return acme, beta


async def test_bad_credentials_are_refused(tenancy: TenancyCluster) -> None:
    acme, _beta = await two_tenants(tenancy)
    topic = "acme%orders"
    # The real thing works (so each refusal below is about the credential only).
    await accepted(tenancy, send_cmd(topic), token=acme.token)
    await accepted(tenancy, signed(send_cmd(topic), acme.access_key, acme.secret))

    await refused(tenancy, send_cmd(topic), "no credentials")

    # Expired: signed by the control plane's real key, with a clock an hour behind.
    services = tenancy.services
    past = TokenService(
        services.pool, Sealer(tenancy.settings.master_key), tenancy.settings, clock_s=lambda: time.time() - 3600
    )
    old, _ = await past.mint(access_key=acme.access_key, tenant="acme", role="tenant", grants=[])
    await refused(tenancy, send_cmd(topic), "token expired", token=old)

    # Tampered: another tenant written into a real token's claims, its signature kept.
    header, payload, sig = acme.token.split(".")
    claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["tenant"] = "beta"
    await refused(tenancy, send_cmd("beta%orders"), "signature does not verify", token=f"{header}.{_b64(claims)}.{sig}")

    # Signed by a key that is not the control plane's (same kid as the real one).
    kid = jwt.get_unverified_header(acme.token)["kid"]
    claims["tenant"] = "acme"
    forged = jwt.encode(claims, Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": kid})
    await refused(tenancy, send_cmd(topic), "signature does not verify", token=forged)

    # alg=none.
    none_token = f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': kid})}.{_b64(claims)}."
    await refused(tenancy, send_cmd(topic), "'none' is not accepted", token=none_token)

    # A stock-client-style signature made with a wrong secret; an unknown access key.
    await refused(tenancy, signed(send_cmd(topic), acme.access_key, "not-" + acme.secret), "signature does not match")
    await refused(tenancy, signed(send_cmd(topic), "AK" + "A" * 20, acme.secret), "unknown access key")


async def test_a_tenant_cannot_touch_another_tenants_resources(tenancy: TenancyCluster) -> None:
    acme, beta = await two_tenants(tenancy)
    # Own resources: allowed.
    await accepted(tenancy, send_cmd("acme%orders"), token=acme.token)
    resp = await tenancy.invoke(pull_cmd("acme%orders", "acme%billing"), token=acme.token)
    assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (resp.code, resp.remark)
    not_acmes = "in tenant 'beta''s namespace, not 'acme''s"
    for auth in ("token", "access key"):

        def as_acme(cmd: RemotingCommand, auth: str = auth) -> tuple[RemotingCommand, str | None]:
            if auth == "token":
                return cmd, acme.token
            return signed(cmd, acme.access_key, acme.secret), None

        for cmd in (
            send_cmd("beta%orders"),  # send to beta's topic
            pull_cmd("beta%orders", "beta%billing"),  # pull beta's topic with beta's group
            pull_cmd("beta%orders", "acme%billing"),  # ... with its own group
            pull_cmd("acme%orders", "beta%billing"),  # its own topic in beta's group
            offset_cmd("acme%orders", "beta%billing"),  # beta's group's offsets
        ):
            c, token = as_acme(cmd)
            await refused(tenancy, c, not_acmes, token=token)
    # And the other way round, for beta.
    await refused(tenancy, send_cmd("acme%orders"), "in tenant 'acme''s namespace, not 'beta''s", token=beta.token)


async def test_revoked_credential_stops_working(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    # A second credential, to revoke; the first one keeps working.
    made = await tenancy.cp.call("POST", "/v1/tenants/acme/credentials", token=acme.token, json={})
    assert made.status == 201, made.body
    ak, secret = made.body["access_key"], made.body["secret"]
    token = await tenancy.cp.token_for(ak, secret)
    await tenancy.reconciled(rounds=2)
    await accepted(tenancy, signed(send_cmd("acme%orders"), ak, secret))
    await accepted(tenancy, send_cmd("acme%orders"), token=token)

    reply = await tenancy.cp.call("DELETE", f"/v1/tenants/acme/credentials/{ak}", token=acme.token)
    assert reply.status in (200, 204), reply.body
    revoked_at = time.monotonic()

    async def refused_now() -> bool:
        a = await tenancy.invoke(signed(send_cmd("acme%orders"), ak, secret))
        b = await tenancy.invoke(send_cmd("acme%orders"), token=token)
        return a.code == ResponseCode.NO_PERMISSION and b.code == ResponseCode.NO_PERMISSION

    await until(refused_now, "the revoked credential refused by the broker", timeout_s=PROPAGATION_S)
    print(f"\nrevoked credential refused {time.monotonic() - revoked_at:.2f} s after the DELETE")
    await refused(tenancy, signed(send_cmd("acme%orders"), ak, secret), "access key revoked")
    await refused(tenancy, send_cmd("acme%orders"), "revoked", token=token)
    # The tenant's other credential is unaffected.
    await accepted(tenancy, send_cmd("acme%orders"), token=acme.token)
    await accepted(tenancy, signed(send_cmd("acme%orders"), acme.access_key, acme.secret))


async def test_suspended_tenant_is_refused(tenancy: TenancyCluster) -> None:
    acme, beta = await two_tenants(tenancy)
    await accepted(tenancy, send_cmd("acme%orders"), token=acme.token)
    reply = await tenancy.cp.call("POST", "/v1/tenants/acme/suspend", operator=True)
    assert reply.status == 200, reply.body

    async def refused_now() -> bool:
        resp = await tenancy.invoke(send_cmd("acme%orders"), token=acme.token)
        return resp.code == ResponseCode.NO_PERMISSION

    await until(refused_now, "the suspended tenant refused by the broker", timeout_s=PROPAGATION_S)
    await refused(tenancy, send_cmd("acme%orders"), "suspended", token=acme.token)
    await refused(tenancy, signed(send_cmd("acme%orders"), acme.access_key, acme.secret), "suspended")
    await refused(tenancy, pull_cmd("acme%orders", "acme%billing"), "suspended", token=acme.token)
    # Another tenant is unaffected; resuming lets acme back in.
    await accepted(tenancy, send_cmd("beta%orders"), token=beta.token)
    reply = await tenancy.cp.call("POST", "/v1/tenants/acme/resume", operator=True)
    assert reply.status == 200, reply.body

    async def accepted_now() -> bool:
        resp = await tenancy.invoke(send_cmd("acme%orders"), token=acme.token)
        return resp.code == ResponseCode.SUCCESS

    await until(accepted_now, "the resumed tenant accepted again", timeout_s=PROPAGATION_S)


# --- connections -------------------------------------------------------------------------------
CONNECTION_LIMIT = 2


@contextlib.asynccontextmanager
async def own_connection() -> AsyncIterator[RemotingClient]:
    """A client of its own: its own TCP connection to the broker."""
    client = RemotingClient()
    try:
        yield client
    finally:
        await client.close()


async def send(cluster: TenancyCluster, client: RemotingClient, tenant: Tenant) -> RemotingCommand:
    cmd = send_cmd(f"{tenant.id}%orders")
    cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {tenant.token}"}
    return await client.invoke(cluster.broker_addr, cmd, 5000)


async def test_a_tenant_past_its_connection_limit_is_refused_and_others_are_not(tenancy: TenancyCluster) -> None:
    """At most ``max_connections_per_tenant`` connections a tenant: past it the first request is
    answered SYSTEM_BUSY, saying why, and the connection closed; other tenants are not affected,
    and a closed connection makes room again."""
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", f"max_connections_per_tenant={CONNECTION_LIMIT}")
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    for t in (acme, beta):
        await tenancy.create_topic(t, "orders")

    async with contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(own_connection()) for _ in range(CONNECTION_LIMIT)]
        for client in held:
            assert (await send(tenancy, client, acme)).code == ResponseCode.SUCCESS
        async with own_connection() as extra:
            resp = await send(tenancy, extra, acme)
            assert resp.code == ResponseCode.SYSTEM_BUSY, (resp.code, resp.remark)
            assert f"tenant acme holds {CONNECTION_LIMIT} connections" in (resp.remark or "")
            conn = await extra.connection(tenancy.broker_addr)
            await until(lambda: conn.closed, "the broker to close the refused connection")
        # The connections within the limit still work; another tenant is not counted with acme.
        for client in held:
            assert (await send(tenancy, client, acme)).code == ResponseCode.SUCCESS
        async with own_connection() as other:
            assert (await send(tenancy, other, beta)).code == ResponseCode.SUCCESS

        # Closing one of acme's connections makes room for a new one.
        await held.pop().close()

        async def new_one_admitted() -> bool:
            async with own_connection() as again:
                return (await send(tenancy, again, acme)).code == ResponseCode.SUCCESS

        await until(new_one_admitted, "a new connection of acme's once one was closed")


async def test_the_plans_connection_and_in_flight_limits_reach_the_broker(tenancy: TenancyCluster) -> None:
    """A tenant's quota override of ``max_connections`` and ``max_inflight_requests`` is what the
    broker enforces: a connection past the first limit is refused and closed, a request past the
    second (long-polling pulls held on an empty queue count while held) answered SYSTEM_BUSY, each
    counted as one of the tenant's throttled requests; another tenant's requests on the same
    broker are not counted with it."""
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    for t in (acme, beta):
        await tenancy.create_topic(t, "orders")
        await tenancy.create_group(t, "g")
    reply = await tenancy.cp.call(
        "PUT", "/v1/tenants/acme/quota", operator=True, json={"max_connections": 2, "max_inflight_requests": 3}
    )
    assert reply.status == 200, reply.body
    assert reply.body["effective"]["max_connections"] == 2
    await tenancy.reconciled(rounds=2)

    def held_pull(tenant: Tenant, queue_id: int) -> RemotingCommand:
        cmd = protocol.pull_request(
            group=f"{tenant.id}%g", mq=MessageQueue(f"{tenant.id}%orders", "broker-a", queue_id), offset=0,
            max_nums=1, subscription="*", sub_version=0, suspend_timeout_ms=8000, commit_offset=0, suspend=True,
        )  # fmt: skip
        cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {tenant.token}"}
        return cmd

    async with own_connection() as a1, own_connection() as a2, own_connection() as a3, own_connection() as b1:
        assert (await send(tenancy, a1, acme)).code == ResponseCode.SUCCESS
        assert (await send(tenancy, a2, acme)).code == ResponseCode.SUCCESS
        third = await send(tenancy, a3, acme)
        assert third.code == ResponseCode.SYSTEM_BUSY, (third.code, third.remark)
        assert "holds 2 connections" in (third.remark or "")
        # Pulls held on acme's empty queues (its sends went to queue 0) over its two connections.
        # A connection's requests are handled in order: a send's answer there means the pulls
        # before it are held.
        held = [
            asyncio.ensure_future(c.invoke(tenancy.broker_addr, held_pull(acme, q), 15_000))
            for c, q in ((a1, 1), (a2, 2))
        ]
        assert (await send(tenancy, a1, acme)).code == ResponseCode.SUCCESS
        assert (await send(tenancy, a2, acme)).code == ResponseCode.SUCCESS
        held.append(asyncio.ensure_future(a1.invoke(tenancy.broker_addr, held_pull(acme, 3), 15_000)))
        busy = await send(tenancy, a1, acme)  # three in flight: this one would be the fourth
        assert busy.code == ResponseCode.SYSTEM_BUSY, (busy.code, busy.remark)
        assert "max_inflight_requests" in (busy.remark or "")
        assert not any(h.done() for h in held)
        # beta's pull on the same broker is held as usual, and beta's sends are taken: acme's
        # requests in flight are not beta's.
        other = asyncio.ensure_future(b1.invoke(tenancy.broker_addr, held_pull(beta, 1), 15_000))
        assert (await send(tenancy, b1, beta)).code == ResponseCode.SUCCESS
        assert not other.done()
        for h in [*held, other]:
            h.cancel()

    # Both refusals are acme's throttled requests in its usage (the held pulls refused nothing);
    # beta was refused nothing.
    async def throttled(tenant: Tenant) -> int:
        reply = await tenancy.cp.call("GET", f"/v1/tenants/{tenant.id}/usage?granularity=minute", token=tenant.token)
        assert reply.status == 200, reply.body
        return int(reply.body["totals"]["throttled_requests"])

    async def reported() -> bool:
        return await throttled(acme) == 2 and await throttled(beta) == 0

    await until(reported, "acme's 2 throttled requests in its usage", timeout_s=20)
