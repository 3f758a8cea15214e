"""Operators: the broker fleet — broker groups with capacity, their hosts, and each host's broker
credential (issued, rotated and revoked here; the secret is in the issuing answer only)."""

from __future__ import annotations

import re

from aiohttp import web

from control_plane import auth, context
from control_plane.names import BROKER_GROUP_NAME
from control_plane.request_body import ADDRESS, BIGINT_FIELD_MAX
from control_plane.routes import Route, json_response

HOST = re.compile(r"^[A-Za-z0-9.\-]{1,253}$")
ADDR_HOST = re.compile(r"^[A-Za-z0-9.\-:]{1,253}$")  # the host of a broker address: a name, IPv4 or IPv6


def _group_name(request: web.Request) -> str:
    return auth.path_name(request, "group", BROKER_GROUP_NAME)


async def create_group(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    body = await context.body(
        request, ("name", "namesrv_addrs", "broker_addrs", "max_queues", "max_msgs_per_s", "storage_bytes")
    )
    group = await context.services(request).fleet.create_group(
        name=body.name("name", BROKER_GROUP_NAME, what=f"a broker name matching {BROKER_GROUP_NAME.pattern}"),
        namesrv_addrs=body.addresses("namesrv_addrs"),
        broker_addrs=body.addresses("broker_addrs"),
        max_queues=body.required_integer("max_queues", maximum=1_000_000),
        max_msgs_per_s=body.required_integer("max_msgs_per_s", maximum=BIGINT_FIELD_MAX),
        storage_bytes=body.required_integer("storage_bytes", maximum=BIGINT_FIELD_MAX),
    )
    return json_response(group, status=201)


async def list_groups(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response({"broker_groups": await context.services(request).fleet.list_groups()})


async def get_group(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response(await context.services(request).fleet.get_group(_group_name(request)))


async def update_group(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    name = _group_name(request)
    body = await context.body(
        request, ("max_queues", "max_msgs_per_s", "storage_bytes", "status", "namesrv_addrs", "broker_addrs")
    )
    group = await context.services(request).fleet.update_group(
        name,
        namesrv_addrs=body.addresses("namesrv_addrs") if body.has("namesrv_addrs") else None,
        broker_addrs=body.addresses("broker_addrs") if body.has("broker_addrs") else None,
        max_queues=body.integer("max_queues", maximum=1_000_000),
        max_msgs_per_s=body.integer("max_msgs_per_s", maximum=BIGINT_FIELD_MAX),
        storage_bytes=body.integer("storage_bytes", maximum=BIGINT_FIELD_MAX),
        status=body.choice("status", ("active", "draining")),
    )
    return json_response(group)


async def delete_group(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response(await context.services(request).fleet.delete_group(_group_name(request)))


async def add_host(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    name = _group_name(request)
    body = await context.body(request, ("broker_id", "host", "address"))
    host = await context.services(request).fleet.add_host(
        broker_group=name,
        broker_id=body.required_integer("broker_id", maximum=64),
        host=body.name("host", HOST, what="a host name"),
        address=body.name("address", ADDRESS, what="HOST:PORT"),
    )
    return json_response(host, status=201)


async def list_hosts(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    hosts = await context.services(request).fleet.list_host_credentials(broker_group=_group_name(request))
    return json_response({"hosts": hosts})


async def issue_host_credential(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    made = await context.services(request).fleet.issue_host_credential(
        broker_group=_group_name(request), host=auth.path_name(request, "host", ADDR_HOST)
    )
    return json_response(made, status=201, headers={"Cache-Control": "no-store"})


async def revoke_host_credential(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    revoked = await context.services(request).fleet.revoke_host_credential(
        broker_group=_group_name(request), host=auth.path_name(request, "host", ADDR_HOST)
    )
    return json_response(revoked)


ADDRS = {"type": "array", "items": {"type": "string", "description": "HOST:PORT"}, "maxItems": 16}
GROUP_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": BROKER_GROUP_NAME.pattern, "description": "the broker name"},
        "namesrv_addrs": ADDRS,
        "broker_addrs": ADDRS,
        "max_queues": {"type": "integer", "minimum": 0},
        "max_msgs_per_s": {"type": "integer", "minimum": 0},
        "storage_bytes": {"type": "integer", "minimum": 0},
    },
    "required": ["name", "max_queues", "max_msgs_per_s", "storage_bytes"],
}
GROUP_PATCH = {
    "type": "object",
    "properties": {
        "max_queues": {"type": "integer", "minimum": 0},
        "max_msgs_per_s": {"type": "integer", "minimum": 0},
        "storage_bytes": {"type": "integer", "minimum": 0},
        "status": {"type": "string", "enum": ["active", "draining"]},
        "namesrv_addrs": ADDRS,
        "broker_addrs": ADDRS,
    },
}
HOST_SCHEMA = {
    "type": "object",
    "properties": {
        "broker_id": {"type": "integer", "minimum": 0, "description": "0 = master"},
        "host": {"type": "string"},
        "address": {"type": "string", "description": "HOST:PORT"},
    },
    "required": ["broker_id", "host", "address"],
}
G = "/v1/fleet/broker-groups"
ROUTES = [
    Route(
        "POST",
        G,
        create_group,
        "Add a broker group with its capacity",
        "operator",
        "fleet",
        request_schema=GROUP_SCHEMA,
        responses={201: "created", 409: "broker_group_exists"},
    ),
    Route("GET", G, list_groups, "List broker groups with placed queues and hosts", "operator", "fleet"),
    Route("GET", G + "/{group}", get_group, "Get a broker group", "operator", "fleet"),
    Route(
        "PATCH",
        G + "/{group}",
        update_group,
        "Change capacity or status (draining takes no new queues)",
        "operator",
        "fleet",
        request_schema=GROUP_PATCH,
    ),
    Route(
        "DELETE",
        G + "/{group}",
        delete_group,
        "Remove a broker group from the fleet: its hosts' broker credentials are revoked; refused while "
        "topics have queues on it",
        "operator",
        "fleet",
        responses={
            200: "deleted, with the revoked access keys",
            404: "broker_group_not_found",
            409: "broker_group_in_use: topics still have queues placed on it",
        },
    ),
    Route(
        "POST",
        G + "/{group}/hosts",
        add_host,
        "Add or replace a host of a broker group",
        "operator",
        "fleet",
        request_schema=HOST_SCHEMA,
        responses={201: "created"},
    ),
    Route(
        "GET",
        G + "/{group}/hosts",
        list_hosts,
        "List the hosts of the group's broker_addrs with their broker credential's access key, status and "
        "times (never the secret)",
        "operator",
        "fleet",
        responses={200: "OK", 404: "broker_group_not_found"},
    ),
    Route(
        "POST",
        G + "/{group}/hosts/{host}/credential",
        issue_host_credential,
        "Issue the host's broker credential (the secret is shown in this answer only); the host's previous "
        "one is revoked",
        "operator",
        "fleet",
        responses={
            201: "created, with secret",
            404: "broker_group_not_found, or broker_host_not_found: the host is on none of the group's broker_addrs",
        },
    ),
    Route(
        "DELETE",
        G + "/{group}/hosts/{host}/credential",
        revoke_host_credential,
        "Revoke the host's broker credential",
        "operator",
        "fleet",
        responses={
            200: "revoked",
            404: "broker_group_not_found, broker_host_not_found, or credential_not_found: the host has none",
        },
    ),
]
