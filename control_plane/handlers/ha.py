"""Failover leases: brokers' heartbeats (``POST /internal/v1/ha/heartbeat``) and the operators'
view of every broker group's master, epoch and replication lag (``GET /v1/fleet/ha``)."""

from __future__ import annotations

import re

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField
from control_plane.names import BROKER_GROUP_NAME
from control_plane.request_body import ADDRESS, BIGINT_FIELD_MAX
from control_plane.routes import Route, json_response
from control_plane.services.ha import ROLES, Heartbeat

MAX_OFFSET = BIGINT_FIELD_MAX
MAX_MEMBER_ID = 99
INSTANCE = re.compile(r"[0-9a-f]{8,64}")


def _number(value: object, field: str, lo: float, hi: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidField(field, f"must be a number within {lo:g}..{hi:g}")
    return float(value)


def _member_ids(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_MEMBER_ID + 1:
        raise InvalidField("in_sync", f"must be a list of at most {MAX_MEMBER_ID + 1} member ids")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_MEMBER_ID:
            raise InvalidField(f"in_sync[{i}]", f"must be a member id within 0..{MAX_MEMBER_ID}")
    return tuple(value)


async def heartbeat(request: web.Request) -> web.StreamResponse:
    principal = await auth.broker(request)
    body = await context.body(
        request,
        ("cluster", "broker_name", "member_id", "addr", "ha_addr", "max_offset", "epoch", "acting_master",
         "master_role", "lag_bytes", "lease_s", "instance", "heard", "log_epoch", "in_sync", "interval_s",
         "master_unreachable_s"),
    )  # fmt: skip
    beat = Heartbeat(
        cluster=body.name("cluster", BROKER_GROUP_NAME, what="a cluster name"),
        broker_name=body.name("broker_name", BROKER_GROUP_NAME, what="a broker name"),
        member_id=body.required_integer("member_id", maximum=MAX_MEMBER_ID),
        addr=body.name("addr", ADDRESS, what="HOST:PORT"),
        ha_addr=body.name("ha_addr", ADDRESS, what="HOST:PORT") if body.data.get("ha_addr") else "",
        max_offset=body.required_integer("max_offset", maximum=MAX_OFFSET),
        epoch=body.required_integer("epoch", maximum=MAX_OFFSET),
        acting_master=bool(body.boolean("acting_master", default=False)),
        master_role=body.choice("master_role", ROLES),
        lag_bytes=body.integer("lag_bytes", maximum=MAX_OFFSET),
        lease_s=_number(body.data.get("lease_s"), "lease_s", 1, 300),
        instance=body.name("instance", INSTANCE, what="8..64 lower-case hex digits") if body.has("instance") else "",
        heard=body.integer("heard", maximum=MAX_OFFSET) or 0,
        log_epoch=body.integer("log_epoch", maximum=MAX_OFFSET) or 0,
        in_sync=_member_ids(body.data.get("in_sync")),
        interval_s=_number(body.data.get("interval_s", 1.0), "interval_s", 0.05, 60),
        access_key=principal.access_key,
        master_unreachable_s=(
            _number(body.data["master_unreachable_s"], "master_unreachable_s", 0, 86_400)
            if body.has("master_unreachable_s")
            else None
        ),
    )
    answer = await context.services(request).ha.heartbeat(beat)
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
                "instance": {"type": "string", "pattern": "^[0-9a-f]{8,64}$"},
                "heard": {"type": "integer", "minimum": 0},
                "log_epoch": {"type": "integer", "minimum": 0},
                "in_sync": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 99},
                    "maxItems": 100,
                },
                "interval_s": {"type": "number", "minimum": 0.05, "maximum": 60},
                "master_unreachable_s": {"type": "number", "minimum": 0, "maximum": 86400},
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
