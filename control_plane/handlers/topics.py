"""Tenants: topics. The control plane picks queue counts and broker groups (see placement)."""

from __future__ import annotations

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField
from control_plane.names import RESOURCE_NAME
from control_plane.request_body import Body
from control_plane.routes import Route, json_response
from control_plane.services.topics import MAX_RETENTION_HOURS, MESSAGE_TYPES, UNCHANGED, UNLIMITED, Retention, Unchanged

MAX_HINT = 10_000_000
SPEC = ("retention_hours", "local_retention_hours", "throughput_hint_msgs_per_s", "description")  # what PATCH changes


def retention_hours(body: Body) -> Retention | None:
    """``retention_hours``: hours 1..MAX_RETENTION_HOURS or "unlimited" (None: left out or null)."""
    value = body.data.get("retention_hours")
    if value is None or value == UNLIMITED:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RETENTION_HOURS:
        raise InvalidField("retention_hours", f'must be an integer within 1..{MAX_RETENTION_HOURS} or "unlimited"')
    return value


def local_retention_hours(body: Body) -> int | None:
    return body.integer("local_retention_hours", minimum=1, maximum=MAX_RETENTION_HOURS)


async def create_topic(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_member(request)
    body = await context.body(request, ("name", "message_type", *SPEC))
    name = auth.new_resource_name(principal, body, "topic")
    topic, created = await context.services(request).topics.create(
        tenant_id=tenant_id,
        name=name,
        message_type=body.choice("message_type", MESSAGE_TYPES, default="NORMAL") or "NORMAL",
        retention_hours=retention_hours(body),
        local_retention_hours=local_retention_hours(body),
        throughput_hint_msgs_per_s=body.integer("throughput_hint_msgs_per_s", minimum=1, maximum=MAX_HINT),
        description=body.text("description", default="") or "",
    )
    return json_response(topic, status=201 if created else 200)


async def list_topics(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_resource(request, "topic", None, None)
    topics = await context.services(request).topics.list_topics(tenant_id=tenant_id)
    return json_response({"topics": auth.visible(principal, "topic", topics)})


async def get_topic(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", None)
    return json_response(await context.services(request).topics.get(tenant_id=tenant_id, name=name))


async def scaling_events(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", None)
    events = await context.services(request).topics.scaling_events(tenant_id=tenant_id, name=name)
    return json_response({"events": events})


async def update_topic(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", "admin")
    body = await context.body(request, SPEC)
    # local_retention_hours: left out, unchanged; null, back to the broker's default.
    local: int | Unchanged | None = local_retention_hours(body) if "local_retention_hours" in body.data else UNCHANGED
    topic = await context.services(request).topics.update(
        tenant_id=tenant_id,
        name=name,
        retention_hours=retention_hours(body),
        local_retention_hours=local,
        throughput_hint_msgs_per_s=body.integer("throughput_hint_msgs_per_s", minimum=1, maximum=MAX_HINT),
        description=body.text("description"),
    )
    return json_response(topic)


async def delete_topic(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", "admin")
    await context.services(request).topics.delete(tenant_id=tenant_id, name=name)
    return web.Response(status=204)


RETENTION_SCHEMA = {
    "oneOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_RETENTION_HOURS},
        {"const": UNLIMITED, "description": "kept for good: only on a plan with unlimited_retention"},
    ],
    "description": "total retention, on brokers' disks and in object storage; at most the plan's max_retention_hours",
}
LOCAL_RETENTION_SCHEMA = {
    "type": ["integer", "null"],
    "minimum": 1,
    "maximum": MAX_RETENTION_HOURS,
    "description": "how long brokers keep the messages on their own disks too (null: the broker's "
    "local_retention_hours); at most a finite retention_hours",
}
TOPIC_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": RESOURCE_NAME.pattern},
        "message_type": {"type": "string", "enum": list(MESSAGE_TYPES), "default": "NORMAL"},
        "retention_hours": {
            **RETENTION_SCHEMA,
            "description": f"{RETENTION_SCHEMA['description']}; default min(72, the plan's max_retention_hours)",
        },
        "local_retention_hours": LOCAL_RETENTION_SCHEMA,
        "throughput_hint_msgs_per_s": {
            "type": "integer",
            "minimum": 1,
            "description": "queues = max(4, ceil(hint / 1000)), capped by the plan",
        },
        "description": {"type": "string", "maxLength": 256},
    },
    "required": ["name"],
}
TOPIC_PATCH = {
    "type": "object",
    "properties": {
        "retention_hours": RETENTION_SCHEMA,
        "local_retention_hours": {
            **LOCAL_RETENTION_SCHEMA,
            "description": "left out: unchanged; null: back to the broker's local_retention_hours",
        },
        "throughput_hint_msgs_per_s": {
            "type": "integer",
            "minimum": 1,
            "description": "a larger hint adds queues; queues are never removed",
        },
        "description": {"type": "string", "maxLength": 256},
    },
}
P = "/v1/tenants/{tenant}/topics"
ROUTES = [
    Route(
        "POST",
        P,
        create_topic,
        "Create a topic (idempotent: the same spec again answers 200)",
        "tenant",
        "topics",
        request_schema=TOPIC_SCHEMA,
        responses={
            200: "exists with this spec",
            201: "created",
            409: "topic_exists",
            422: "quota_exceeded (max_retention_hours, unlimited_retention, max_topics, max_queues)",
            503: "insufficient_capacity",
        },
    ),
    Route("GET", P, list_topics, "List the tenant's topics (those the credential's grants cover)", "tenant", "topics"),
    Route("GET", P + "/{name}", get_topic, "Get a topic with its placements", "tenant", "topics"),
    Route(
        "GET",
        P + "/{name}/scaling-events",
        scaling_events,
        "What the autoscaler did to the topic's queues and why, newest first (at most 200)",
        "tenant",
        "topics",
    ),
    Route(
        "PATCH",
        P + "/{name}",
        update_topic,
        "Change retention, local retention, throughput hint or description",
        "tenant",
        "topics",
        request_schema=TOPIC_PATCH,
        responses={200: "changed", 422: "quota_exceeded (max_retention_hours, unlimited_retention, max_queues)"},
    ),
    Route("DELETE", P + "/{name}", delete_topic, "Delete a topic", "tenant", "topics", responses={204: "deleted"}),
]
