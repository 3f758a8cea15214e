"""Operators: tenants (create, list, get, change, suspend, resume, delete), plans and quota
overrides. Tenants may read their own quota."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField
from control_plane.names import PLAN_NAME, TENANT_ID
from control_plane.repositories.plans import LIMIT_FIELDS, NULLABLE_LIMITS, PLAN_COLUMNS, PLAN_DEFAULTS, PLAN_FIELDS
from control_plane.request_body import COLUMN_MAX, Body
from control_plane.routes import Route, json_response

TENANT_ID_TEXT = f"a tenant id matching {TENANT_ID.pattern}"
# Each integer field's range, for plans and overrides alike: from the plans columns' CHECK
# (max_retention_hours >= 1, the others >= 0) up to what the column's type holds.
INTEGER_RANGES = {
    f: (1 if f == "max_retention_hours" else 0, COLUMN_MAX[t]) for f, t in PLAN_COLUMNS.items() if t != "boolean"
}


def _field_schema(f: str, *, override: bool) -> dict[str, Any]:
    """A plan's field (``override``: a tenant's override of it, where null is the plan's)."""
    kind = "boolean" if PLAN_COLUMNS[f] == "boolean" else "integer"
    schema: dict[str, Any] = {"type": [kind, "null"] if override or f in NULLABLE_LIMITS else kind}
    if kind == "integer":
        schema["minimum"], schema["maximum"] = INTEGER_RANGES[f]
    if f in NULLABLE_LIMITS and not override:
        schema["description"] = "null: no limit"
    return schema


def plan_field(body: Body, f: str, *, required: bool = False) -> int | bool | None:
    """One plan or override field, checked against its column (None: left out or null)."""
    if PLAN_COLUMNS[f] == "boolean":
        return body.boolean(f)
    lo, hi = INTEGER_RANGES[f]
    return body.integer(f, minimum=lo, maximum=hi, required=required)


def plan_fields(body: Body) -> dict[str, int | bool | None]:
    """A whole plan: every field checked, those left out at their defaults (required without one)."""
    given = {f: plan_field(body, f, required=f not in PLAN_DEFAULTS) for f in PLAN_FIELDS}
    return {f: PLAN_DEFAULTS[f] if v is None else v for f, v in given.items()}


def plan_name_of(request: web.Request) -> str:
    return auth.path_name(request, "plan", PLAN_NAME)


async def create_tenant(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    body = await context.body(request, ("id", "display_name", "plan"))
    tenant_id = body.name("id", TENANT_ID, what=TENANT_ID_TEXT)
    plan = body.text("plan", default="free") or "free"
    if not PLAN_NAME.fullmatch(plan):
        raise InvalidField("plan", "must be a plan name")
    tenant = await context.services(request).tenants.create(
        tenant_id=tenant_id, display_name=body.text("display_name", default="") or "", plan=plan
    )
    return json_response(tenant, status=201)


async def list_tenants(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response({"tenants": await context.services(request).tenants.list_tenants()})


async def get_tenant(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response(await context.services(request).tenants.get(tenant_id=auth.tenant_id_of(request)))


async def update_tenant(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    tenant_id = auth.tenant_id_of(request)
    body = await context.body(request, ("display_name", "plan"))
    plan = body.text("plan")
    if plan is not None and not PLAN_NAME.fullmatch(plan):
        raise InvalidField("plan", "must be a plan name")
    tenant = await context.services(request).tenants.update(
        tenant_id=tenant_id, display_name=body.text("display_name"), plan=plan
    )
    return json_response(tenant)


async def delete_tenant(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    await context.services(request).tenants.delete(tenant_id=auth.tenant_id_of(request))
    return web.Response(status=204)


async def suspend_tenant(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    tenants = context.services(request).tenants
    return json_response(await tenants.set_status(tenant_id=auth.tenant_id_of(request), status="suspended"))


async def resume_tenant(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    tenants = context.services(request).tenants
    return json_response(await tenants.set_status(tenant_id=auth.tenant_id_of(request), status="active"))


async def list_plans(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response({"plans": await context.services(request).tenants.list_plans()})


async def get_plan(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response(await context.services(request).tenants.get_plan(plan_name_of(request)))


async def put_plan(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    name = plan_name_of(request)
    body = await context.body(request, PLAN_FIELDS)
    plan, created = await context.services(request).tenants.put_plan(name, plan_fields(body))
    return json_response(plan, status=201 if created else 200)


async def get_quota(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_member(request)
    return json_response(await context.services(request).tenants.quota(tenant_id=tenant_id))


async def put_quota(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    tenant_id = auth.tenant_id_of(request)
    body = await context.body(request, LIMIT_FIELDS)
    overrides = {f: plan_field(body, f) for f in LIMIT_FIELDS}
    return json_response(await context.services(request).tenants.put_quota(tenant_id=tenant_id, overrides=overrides))


TENANT_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": TENANT_ID.pattern},
        "display_name": {"type": "string", "maxLength": 256},
        "plan": {"type": "string", "default": "free"},
    },
    "required": ["id"],
}
TENANT_PATCH = {
    "type": "object",
    "properties": {"display_name": {"type": "string", "maxLength": 256}, "plan": {"type": "string"}},
}
PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        f: _field_schema(f, override=False) | ({"default": PLAN_DEFAULTS[f]} if f in PLAN_DEFAULTS else {})
        for f in PLAN_FIELDS
    },
    "required": [f for f in PLAN_FIELDS if f not in PLAN_DEFAULTS],
}
QUOTA_SCHEMA = {
    "type": "object",
    "description": "overrides replace the tenant's: a field left out or null falls back to the plan",
    "properties": {f: _field_schema(f, override=True) for f in LIMIT_FIELDS},
}
T = "/v1/tenants/{tenant}"
ROUTES = [
    Route(
        "POST",
        "/v1/tenants",
        create_tenant,
        "Create a tenant",
        "operator",
        "tenants",
        request_schema=TENANT_SCHEMA,
        responses={201: "created", 409: "tenant_exists"},
    ),
    Route("GET", "/v1/tenants", list_tenants, "List tenants", "operator", "tenants"),
    Route("GET", T, get_tenant, "Get a tenant", "operator", "tenants"),
    Route(
        "PATCH",
        T,
        update_tenant,
        "Change a tenant's display name or plan",
        "operator",
        "tenants",
        request_schema=TENANT_PATCH,
    ),
    Route(
        "DELETE",
        T,
        delete_tenant,
        "Delete a tenant: topics and groups go, credentials are revoked",
        "operator",
        "tenants",
        responses={204: "deleted"},
    ),
    Route(
        "POST", T + "/suspend", suspend_tenant, "Suspend a tenant: no new tokens, API refused", "operator", "tenants"
    ),
    Route("POST", T + "/resume", resume_tenant, "Resume a suspended tenant", "operator", "tenants"),
    Route("GET", "/v1/plans", list_plans, "List plans", "operator", "plans"),
    Route("GET", "/v1/plans/{plan}", get_plan, "Get a plan", "operator", "plans"),
    Route(
        "PUT",
        "/v1/plans/{plan}",
        put_plan,
        "Create or replace a plan",
        "operator",
        "plans",
        request_schema=PLAN_SCHEMA,
        responses={200: "replaced", 201: "created"},
    ),
    Route("GET", T + "/quota", get_quota, "A tenant's plan, overrides and effective limits", "tenant", "plans"),
    Route(
        "PUT",
        T + "/quota",
        put_quota,
        "Replace a tenant's quota overrides",
        "operator",
        "plans",
        request_schema=QUOTA_SCHEMA,
    ),
]
