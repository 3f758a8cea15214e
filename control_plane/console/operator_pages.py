"""An operator's pages: tenants (create, suspend, resume, plan, quota overrides) and plans (the
fleet's are in ``fleet_pages``). Every page begins with the API's operator check
(``auth.operator``); a topic's queue placement is on the topic's page, which operators reach
for any tenant."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.console import forms
from control_plane.console.render import page, redirect, render, require_operator
from control_plane.errors import InvalidField, PlanNotFound
from control_plane.handlers import tenants as tenant_handlers
from control_plane.names import PLAN_NAME, TENANT_ID
from control_plane.repositories.plans import LIMIT_FIELDS, PLAN_COLUMNS, PLAN_DEFAULTS, PLAN_FIELDS
from control_plane.request_body import Body

OPS = "/console/ops"


@page
async def tenants(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    services = context.services(request)
    plans = [p["name"] for p in await services.tenants.list_plans()]
    return render(request, "ops_tenants.html", tenants=await services.tenants.list_tenants(), plans=plans)


@page
async def create_tenant(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    body = await forms.form_body(request, ("id", "display_name", "plan"))
    tenant_id = body.name("id", TENANT_ID, what=tenant_handlers.TENANT_ID_TEXT)
    plan = body.text("plan", default="free") or "free"
    if not PLAN_NAME.fullmatch(plan):
        raise InvalidField("plan", "must be a plan name")
    await context.services(request).tenants.create(
        tenant_id=tenant_id, display_name=body.text("display_name", default="") or "", plan=plan
    )
    return redirect(request, f"{OPS}/tenants/{tenant_id}", flash=f"Tenant {tenant_id} created.")


@page
async def tenant(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    tenant_id = auth.tenant_id_of(request)
    services = context.services(request)
    found = await services.tenants.get(tenant_id=tenant_id)
    plans = [p["name"] for p in await services.tenants.list_plans()]
    quota = await services.tenants.quota(tenant_id=tenant_id)
    fields = [(f, PLAN_COLUMNS[f] == "boolean") for f in LIMIT_FIELDS]
    return render(request, "ops_tenant.html", tenant=found, plans=plans, quota=quota, fields=fields)


@page
async def suspend(request: web.Request) -> web.StreamResponse:
    return await _set_status(request, "suspended")


@page
async def resume(request: web.Request) -> web.StreamResponse:
    return await _set_status(request, "active")


async def _set_status(request: web.Request, status: str) -> web.StreamResponse:
    await require_operator(request)
    tenant_id = auth.tenant_id_of(request)
    await context.services(request).tenants.set_status(tenant_id=tenant_id, status=status)
    word = "suspended" if status == "suspended" else "resumed"
    return redirect(request, f"{OPS}/tenants/{tenant_id}", flash=f"Tenant {tenant_id} {word}.")


@page
async def change_plan(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    tenant_id = auth.tenant_id_of(request)
    body = await forms.form_body(request, ("plan", "display_name"))
    plan = body.text("plan")
    if plan is None or not PLAN_NAME.fullmatch(plan):
        raise InvalidField("plan", "must be a plan name")
    await context.services(request).tenants.update(
        tenant_id=tenant_id, display_name=body.text("display_name"), plan=plan
    )
    return redirect(request, f"{OPS}/tenants/{tenant_id}", flash=f"Tenant {tenant_id} is on plan {plan}.")


async def _plan_form(request: web.Request, fields: tuple[str, ...]) -> Body:
    """A plan's or an override's fields: numbers, and yes/no selects ("": left out)."""
    booleans = [f for f in fields if PLAN_COLUMNS[f] == "boolean"]
    body = await forms.form_body(request, fields, integers=[f for f in fields if f not in booleans])
    form = await request.post()
    for f in booleans:
        body.data.pop(f, None)
        if form.get(f) in ("true", "false"):
            body.data[f] = form.get(f) == "true"
    return body


@page
async def put_quota(request: web.Request) -> web.StreamResponse:
    """Replace the tenant's overrides: a blank field falls back to the plan."""
    await require_operator(request)
    tenant_id = auth.tenant_id_of(request)
    body = await _plan_form(request, LIMIT_FIELDS)
    overrides = {f: tenant_handlers.plan_field(body, f) for f in LIMIT_FIELDS}
    await context.services(request).tenants.put_quota(tenant_id=tenant_id, overrides=overrides)
    return redirect(request, f"{OPS}/tenants/{tenant_id}", flash=f"Quota overrides of {tenant_id} saved.")


@page
async def plans(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    listed = await context.services(request).tenants.list_plans()
    return render(request, "ops_plans.html", plans=listed, fields=list(PLAN_COLUMNS))


@page
async def new_plan(request: web.Request) -> web.StreamResponse:
    """The plans page's "new plan" box: to that plan's form."""
    await require_operator(request)
    name = request.query.get("name", "").strip()
    if not PLAN_NAME.fullmatch(name):
        raise InvalidField("name", "a plan name: lower-case letters, digits and -")
    return redirect(request, f"{OPS}/plans/{name}")


@page
async def plan(request: web.Request) -> web.StreamResponse:
    """A plan's form (a plan not made yet: its defaults)."""
    await require_operator(request)
    name = tenant_handlers.plan_name_of(request)
    try:
        found: dict[str, Any] | None = await context.services(request).tenants.get_plan(name)
    except PlanNotFound:
        found = None
    values = found if found is not None else {"name": name, **PLAN_DEFAULTS}
    fields = [(f, PLAN_COLUMNS[f] == "boolean") for f in PLAN_FIELDS]
    return render(request, "ops_plan.html", plan=values, exists=found is not None, fields=fields)


@page
async def put_plan(request: web.Request) -> web.StreamResponse:
    """Create or replace the plan, every field (a blank one: its default; some have none)."""
    await require_operator(request)
    name = tenant_handlers.plan_name_of(request)
    fields = tenant_handlers.plan_fields(await _plan_form(request, PLAN_FIELDS))
    _plan, created = await context.services(request).tenants.put_plan(name, fields)
    return redirect(request, f"{OPS}/plans", flash=f"Plan {name} {'created' if created else 'saved'}.")
