"""Tenants: consumer groups (retry policy, max retries, orderly consumption)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.names import RESOURCE_NAME
from control_plane.request_body import Body
from control_plane.routes import Route, json_response
from control_plane.services.groups import DEFAULT_FIXED_INTERVAL_MS, DEFAULT_MAX_RETRIES, RETRY_POLICIES

SPEC = ("retry_policy", "fixed_interval_ms", "max_retries", "consume_orderly", "description")


def spec_of(body: Body, *, defaults: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "retry_policy": body.choice("retry_policy", RETRY_POLICIES, default="exponential" if defaults else None),
        "fixed_interval_ms": body.integer("fixed_interval_ms", minimum=100, maximum=86_400_000),
        "max_retries": body.integer("max_retries", minimum=0, maximum=64),
        "consume_orderly": body.boolean("consume_orderly", default=False if defaults else None),
        "description": body.text("description", default="" if defaults else None),
    }
    if defaults:
        spec["fixed_interval_ms"] = spec["fixed_interval_ms"] or DEFAULT_FIXED_INTERVAL_MS
        if spec["max_retries"] is None:
            spec["max_retries"] = DEFAULT_MAX_RETRIES
        return spec
    return {k: v for k, v in spec.items() if v is not None}


async def create_group(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_member(request)
    body = await context.body(request, ("name", *SPEC))
    name = auth.new_resource_name(principal, body, "group")
    group, created = await context.services(request).groups.create(
        tenant_id=tenant_id, name=name, spec=spec_of(body, defaults=True)
    )
    return json_response(group, status=201 if created else 200)


async def list_groups(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_resource(request, "group", None, None)
    groups = await context.services(request).groups.list_groups(tenant_id=tenant_id)
    return json_response({"groups": auth.visible(principal, "group", groups)})


async def get_group(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "group", None)
    return json_response(await context.services(request).groups.get(tenant_id=tenant_id, name=name))


async def update_group(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "group", "admin")
    body = await context.body(request, SPEC)
    group = await context.services(request).groups.update(
        tenant_id=tenant_id, name=name, changes=spec_of(body, defaults=False)
    )
    return json_response(group)


async def delete_group(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "group", "admin")
    await context.services(request).groups.delete(tenant_id=tenant_id, name=name)
    return web.Response(status=204)


SPEC_PROPERTIES: dict[str, Any] = {
    "retry_policy": {
        "type": "string",
        "enum": list(RETRY_POLICIES),
        "default": "exponential",
        "description": "exponential: RocketMQ's delay levels; fixed: every fixed_interval_ms",
    },
    "fixed_interval_ms": {"type": "integer", "minimum": 100, "default": DEFAULT_FIXED_INTERVAL_MS},
    "max_retries": {"type": "integer", "minimum": 0, "maximum": 64, "default": DEFAULT_MAX_RETRIES},
    "consume_orderly": {"type": "boolean", "default": False},
    "description": {"type": "string", "maxLength": 256},
}
GROUP_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": RESOURCE_NAME.pattern}, **SPEC_PROPERTIES},
    "required": ["name"],
}
P = "/v1/tenants/{tenant}/groups"
ROUTES = [
    Route(
        "POST",
        P,
        create_group,
        "Create a consumer group (idempotent)",
        "tenant",
        "groups",
        request_schema=GROUP_SCHEMA,
        responses={200: "exists with this spec", 201: "created", 409: "group_exists"},
    ),
    Route("GET", P, list_groups, "List the tenant's consumer groups", "tenant", "groups"),
    Route("GET", P + "/{name}", get_group, "Get a consumer group", "tenant", "groups"),
    Route(
        "PATCH",
        P + "/{name}",
        update_group,
        "Change a consumer group",
        "tenant",
        "groups",
        request_schema={"type": "object", "properties": SPEC_PROPERTIES},
    ),
    Route(
        "DELETE", P + "/{name}", delete_group, "Delete a consumer group", "tenant", "groups", responses={204: "deleted"}
    ),
]
