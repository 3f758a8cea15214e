"""Tenants: topics. The control plane picks queue counts and broker groups (see placement)."""

from __future__ import annotations

from aiohttp import web

from control_plane import auth, context
from control_plane.names import RESOURCE_NAME
from control_plane.routes import Route, json_response
from control_plane.services.topics import MESSAGE_TYPES

MAX_HINT = 10_000_000


async def create_topic(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_member(request)
    body = await context.body(
        request, ("name", "message_type", "retention_hours", "throughput_hint_msgs_per_s", "description")
    )
    name = auth.new_resource_name(principal, body, "topic")
    topic, created = await context.services(request).topics.create(
        tenant_id=tenant_id,
        name=name,
        message_type=body.choice("message_type", MESSAGE_TYPES, default="NORMAL") or "NORMAL",
        retention_hours=body.integer("retention_hours", minimum=1, maximum=100_000),
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


async def update_topic(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", "admin")
    body = await context.body(request, ("retention_hours", "throughput_hint_msgs_per_s", "description"))
    topic = await context.services(request).topics.update(
        tenant_id=tenant_id,
        name=name,
        retention_hours=body.integer("retention_hours", minimum=1, maximum=100_000),
        throughput_hint_msgs_per_s=body.integer("throughput_hint_msgs_per_s", minimum=1, maximum=MAX_HINT),
        description=body.text("description"),
    )
    return json_response(topic)


async def delete_topic(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", "admin")
    await context.services(request).topics.delete(tenant_id=tenant_id, name=name)
    return web.Response(status=204)


TOPIC_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": RESOURCE_NAME.pattern},
        "message_type": {"type": "string", "enum": list(MESSAGE_TYPES), "default": "NORMAL"},
        "retention_hours": {"type": "integer", "minimum": 1, "description": "default min(72, plan maximum)"},
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
        "retention_hours": {"type": "integer", "minimum": 1},
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
            422: "quota_exceeded",
            503: "insufficient_capacity",
        },
    ),
    Route("GET", P, list_topics, "List the tenant's topics (those the credential's grants cover)", "tenant", "topics"),
    Route("GET", P + "/{name}", get_topic, "Get a topic with its placements", "tenant", "topics"),
    Route(
        "PATCH",
        P + "/{name}",
        update_topic,
        "Change retention, throughput hint or description",
        "tenant",
        "topics",
        request_schema=TOPIC_PATCH,
    ),
    Route("DELETE", P + "/{name}", delete_topic, "Delete a topic", "tenant", "topics", responses={204: "deleted"}),
]
