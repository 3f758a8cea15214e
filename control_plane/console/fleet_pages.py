"""An operator's fleet pages: broker groups with capacity and placed queues, each member's role,
epoch, replication lag and last heartbeat (the failover leases), what the brokers themselves say
of their CommitLog (read with the operator's session); and the changes the fleet API makes —
add, change, drain and remove a broker group, add its hosts, issue (secret shown once), rotate
and revoke a host's broker credential. Every page begins with the
API's operator check; every change goes through the same service and validators as the API."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.console import forms, load_charts
from control_plane.console.brokers import admin_client
from control_plane.console.render import ConsoleUnavailable, page, redirect, render, require_operator
from control_plane.handlers.fleet import ADDR_HOST, HOST
from control_plane.names import BROKER_GROUP_NAME
from control_plane.request_body import ADDRESS, BIGINT_FIELD_MAX

FLEET = "/console/ops/fleet"
CAPACITY = ("max_queues", "max_msgs_per_s", "storage_bytes")
ADDRS = ("namesrv_addrs", "broker_addrs")
MAX_QUEUES = 1_000_000


def _group_name(request: web.Request) -> str:
    return auth.path_name(request, "group", BROKER_GROUP_NAME)


@page
async def fleet(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    services = context.services(request)
    groups = await services.fleet.list_groups()
    leases = {g["broker_name"]: g for g in await services.ha.groups()}
    brokers: list[dict[str, Any]] = []
    unreachable: str | None = None
    try:
        async with admin_client(request) as admin:
            brokers = await admin.cluster_status()
    except ConsoleUnavailable as e:
        unreachable = str(e)
    for b in brokers:
        st = b.get("status") or {}
        lo, hi = st.get("commitLogMinOffset"), st.get("commitLogMaxOffset")
        b["log_bytes"] = int(hi) - int(lo) if lo is not None and hi is not None else None
    return render(request, "ops_fleet.html", groups=groups, leases=leases, brokers=brokers, unreachable=unreachable)


@page
async def create_group(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    body = await forms.form_body(request, ("name", *ADDRS, *CAPACITY), integers=CAPACITY, lists=ADDRS)
    name = body.name("name", BROKER_GROUP_NAME, what=f"a broker name matching {BROKER_GROUP_NAME.pattern}")
    await context.services(request).fleet.create_group(
        name=name,
        namesrv_addrs=body.addresses("namesrv_addrs"),
        broker_addrs=body.addresses("broker_addrs"),
        max_queues=body.required_integer("max_queues", maximum=MAX_QUEUES),
        max_msgs_per_s=body.required_integer("max_msgs_per_s", maximum=BIGINT_FIELD_MAX),
        storage_bytes=body.required_integer("storage_bytes", maximum=BIGINT_FIELD_MAX),
    )
    return redirect(request, f"{FLEET}/{name}", flash=f"Broker group {name} added.")


@page
async def group(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    name = _group_name(request)
    return await _group_page(request, name, error=None)


async def _group_page(request: web.Request, name: str, *, error: str | None, status: int = 200) -> web.StreamResponse:
    """The group, its hosts, and its publish rate and refusals over the last hour or day
    (``?range=``): its tenant topics' summed, the rate beside its max msgs/s."""
    services = context.services(request)
    found = await services.fleet.get_group(name)
    hosts = await services.fleet.list_host_credentials(broker_group=name)
    w = load_charts.window(request)
    load = await services.load.broker_group_load(group=name, start=w.start, end=w.end)
    history = [
        load_charts.chart(f"Publish rate of {name} (messages/s)", load["buckets"], "publish_rate", w),
        load_charts.chart(f"Requests {name} refused", load["buckets"], "refused", w),
    ]
    return render(
        request, "ops_group.html", status=status, group=found, hosts=hosts, error=error, history=history, window=w
    )


@page
async def update_group(request: web.Request) -> web.StreamResponse:
    """Capacity, status (active, or draining: no new queues) and addresses; a blank field stays."""
    await require_operator(request)
    name = _group_name(request)
    body = await forms.form_body(request, (*CAPACITY, *ADDRS, "status"), integers=CAPACITY, lists=ADDRS)
    await context.services(request).fleet.update_group(
        name,
        namesrv_addrs=body.addresses("namesrv_addrs") if body.has("namesrv_addrs") else None,
        broker_addrs=body.addresses("broker_addrs") if body.has("broker_addrs") else None,
        max_queues=body.integer("max_queues", maximum=MAX_QUEUES),
        max_msgs_per_s=body.integer("max_msgs_per_s", maximum=BIGINT_FIELD_MAX),
        storage_bytes=body.integer("storage_bytes", maximum=BIGINT_FIELD_MAX),
        status=body.choice("status", ("active", "draining")),
    )
    return redirect(request, f"{FLEET}/{name}", flash=f"Broker group {name} saved.")


@page
async def delete_group(request: web.Request) -> web.StreamResponse:
    """Remove the group once its name is typed back; refused (the API's 409) while queues are on it."""
    await require_operator(request)
    name = _group_name(request)
    body = await forms.form_body(request, ("confirm_name",))
    if body.text("confirm_name") != name:
        return await _group_page(request, name, error=f"Type {name} to confirm removing it.", status=400)
    removed = await context.services(request).fleet.delete_group(name)
    revoked = len(removed["revoked_access_keys"])
    return redirect(request, FLEET, flash=f"Broker group {name} removed; {revoked} host credential(s) revoked.")


@page
async def add_host(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    name = _group_name(request)
    body = await forms.form_body(request, ("broker_id", "host", "address"), integers=("broker_id",))
    host = body.name("host", HOST, what="a host name")
    await context.services(request).fleet.add_host(
        broker_group=name,
        broker_id=body.required_integer("broker_id", maximum=64),
        host=host,
        address=body.name("address", ADDRESS, what="HOST:PORT"),
    )
    return redirect(request, f"{FLEET}/{name}", flash=f"Host {host} added to {name}.")


def _host(request: web.Request) -> str:
    return auth.path_name(request, "host", ADDR_HOST)


@page
async def issue_host_credential(request: web.Request) -> web.StreamResponse:
    """A new broker credential for the host (its previous one revoked): the secret, this once."""
    await require_operator(request)
    made = await context.services(request).fleet.issue_host_credential(
        broker_group=_group_name(request), host=_host(request)
    )
    response = render(request, "secret_once.html", made=made, back=f"{FLEET}/{made['broker_group']}")
    response.headers["Cache-Control"] = "no-store"
    return response


@page
async def revoke_host_credential(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    name, host = _group_name(request), _host(request)
    revoked = await context.services(request).fleet.revoke_host_credential(broker_group=name, host=host)
    return redirect(request, f"{FLEET}/{name}", flash=f"Broker credential {revoked['access_key']} of {host} revoked.")
