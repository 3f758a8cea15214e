"""Failover leases: brokers' heartbeats (``POST /internal/v1/ha/heartbeat``) and the operators'
view of every broker group's master, epoch and replication lag (``GET /v1/fleet/ha``)."""

from __future__ import annotations

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField
from control_plane.names import BROKER_GROUP_NAME
from control_plane.request_body import ADDRESS, BIGINT_FIELD_MAX
from control_plane.routes import Route, json_response
from control_plane.services.ha import ROLES

MAX_OFFSET = BIGINT_FIELD_MAX


async def heartbeat(request: web.Request) -> web.StreamResponse:
    await auth.broker(request)
    body = await context.body(
        request,
        ("cluster", "broker_name", "member_id", "addr", "ha_addr", "max_offset", "epoch", "acting_master",
         "master_role", "lag_bytes", "lease_s"),
    )  # fmt: skip
    lease_s = body.data.get("lease_s")
    if not isinstance(lease_s, int | float) or isinstance(lease_s, bool) or not 1 <= lease_s <= 300:
        raise InvalidField("lease_s", "must be a number of seconds within 1..300")
    lag = body.integer("lag_bytes", maximum=MAX_OFFSET)
    answer = await context.services(request).ha.heartbeat(
        cluster=body.name("cluster", BROKER_GROUP_NAME, what="a cluster name"),
        broker_name=body.name("broker_name", BROKER_GROUP_NAME, what="a broker name"),
        member_id=body.required_integer("member_id", maximum=99),
        addr=body.name("addr", ADDRESS, what="HOST:PORT"),
        ha_addr=body.name("ha_addr", ADDRESS, what="HOST:PORT") if body.data.get("ha_addr") else "",
        max_offset=body.required_integer("max_offset", maximum=MAX_OFFSET),
        epoch=body.required_integer("epoch", maximum=MAX_OFFSET),
        acting_master=bool(body.boolean("acting_master", default=False)),
        master_role=body.choice("master_role", ROLES),
        lag_bytes=lag,
        lease_s=float(lease_s),
    )
    return json_response(answer)


async def fleet_view(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response({"broker_groups": await context.services(request).ha.groups()})


ROUTES = [
    Route(
        "POST",
        "/internal/v1/ha/heartbeat",
        heartbeat,
        "A broker group member's heartbeat: renews a master's lease, elects a new master once it lapsed",
        "broker",
        "ha",
        request_schema={
            "type": "object",
            "properties": {
                "cluster": {"type": "string"},
                "broker_name": {"type": "string"},
                "member_id": {"type": "integer", "minimum": 0, "maximum": 99},
                "addr": {"type": "string"},
                "ha_addr": {"type": "string"},
                "max_offset": {"type": "integer", "minimum": 0},
                "epoch": {"type": "integer", "minimum": 0},
                "acting_master": {"type": "boolean"},
                "master_role": {"type": "string", "enum": list(ROLES)},
                "lag_bytes": {"type": "integer", "minimum": 0},
                "lease_s": {"type": "number", "minimum": 1, "maximum": 300},
            },
            "required": ["cluster", "broker_name", "member_id", "addr", "max_offset", "epoch", "lease_s"],
        },
    ),
    Route(
        "GET",
        "/v1/fleet/ha",
        fleet_view,
        "Every broker group's master, epoch, lease and members' replication lag",
        "operator",
        "fleet",
    ),
]
