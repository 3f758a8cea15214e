"""A tenant's pages: topics, consumer groups, credentials with their grants, quotas with usage.

Every page starts with the API's own check for what it shows or changes (``auth.tenant_member``,
``auth.tenant_resource``, ``auth.named_resource``, ``auth.tenant_admin``): a tenant's session
reaches only its tenant (403 otherwise), with its credential's grants; an operator's session
reaches every tenant. Forms are checked by the API's validators (``forms.form_body``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.console import charts, forms, load_charts
from control_plane.console.render import PRINCIPAL, human_bytes, page, redirect, render
from control_plane.errors import InvalidField
from control_plane.grants import Resource, default_grants, grants_to_json
from control_plane.handlers import groups as group_handlers
from control_plane.handlers import topics as topic_handlers
from control_plane.handlers.credentials import access_key_of
from control_plane.principal import Principal
from control_plane.services.groups import RETRY_POLICIES
from control_plane.services.topics import MESSAGE_TYPES
from control_plane.services.usage import GAUGES, USAGE_FIELDS

T = "/console/t/{tenant}"
MAX_SCALING_EVENTS = 50


def _seen(request: web.Request, principal: Principal) -> None:
    request[PRINCIPAL] = principal


async def member(request: web.Request) -> tuple[Principal, str]:
    principal, tenant_id = await auth.tenant_member(request)
    _seen(request, principal)
    return principal, tenant_id


# --- topics ---------------------------------------------------------------------------------------
@page
async def topics(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_resource(request, "topic", None, None)
    _seen(request, principal)
    listed = auth.visible(principal, "topic", await context.services(request).topics.list_topics(tenant_id=tenant_id))
    q = request.query.get("q", "").strip()
    if q:
        listed = [t for t in listed if q.lower() in t["name"].lower()]
    shown = paged(request, listed)
    return render(request, "topics.html", tenant=tenant_id, topics=shown, q=q, message_types=MESSAGE_TYPES)


PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class Paged:
    items: list[dict[str, Any]]
    total: int
    page: int
    pages: int


def paged(request: web.Request, items: list[dict[str, Any]]) -> Paged:
    """``?page=N`` (1-based) of ``items``, PAGE_SIZE a page."""
    raw = request.query.get("page", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidField("page", "must be a page number from 1")
    pages = max(1, -(-len(items) // PAGE_SIZE))
    page = min(int(raw), pages)
    return Paged(items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], len(items), page, pages)


@page
async def create_topic(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await member(request)
    body = await forms.form_body(
        request,
        (
            "name",
            "message_type",
            "retention_hours",
            "local_retention_hours",
            "throughput_hint_msgs_per_s",
            "description",
        ),
        integers=("local_retention_hours", "throughput_hint_msgs_per_s"),
    )
    retention = body.data.get("retention_hours")
    if isinstance(retention, str) and retention != "unlimited":
        try:
            body.data["retention_hours"] = int(retention)
        except ValueError:
            raise InvalidField("retention_hours", 'must be a whole number of hours or "unlimited"') from None
    name = auth.new_resource_name(principal, body, "topic")
    topic, created = await context.services(request).topics.create(
        tenant_id=tenant_id,
        name=name,
        message_type=body.choice("message_type", MESSAGE_TYPES, default="NORMAL") or "NORMAL",
        retention_hours=topic_handlers.retention_hours(body),
        local_retention_hours=topic_handlers.local_retention_hours(body),
        throughput_hint_msgs_per_s=body.integer(
            "throughput_hint_msgs_per_s", minimum=1, maximum=topic_handlers.MAX_HINT
        ),
        description=body.text("description", default="") or "",
    )
    queues = sum(p["queue_count"] for p in topic["placements"])
    done = f"Topic {name} created with {queues} queues." if created else f"Topic {name} already exists as asked."
    return redirect(request, f"/console/t/{tenant_id}/topics/{name}", flash=done)


@page
async def topic(request: web.Request) -> web.StreamResponse:
    """A topic's settings and placement (writable and read-only queues), its publish rate over
    the last hour or day (``?range=``), and what the autoscaler did to it."""
    tenant_id, name = await auth.named_resource(request, "topic", None)
    _seen(request, await auth.authenticate(request))
    services = context.services(request)
    found = await services.topics.get(tenant_id=tenant_id, name=name)
    w = load_charts.window(request)
    load = await services.load.topic_load(tenant_id=tenant_id, topic=name, start=w.start, end=w.end)
    publish = load_charts.chart(f"Publish rate of {name} (messages/s)", load["buckets"], "publish_rate", w)
    events = (await services.topics.scaling_events(tenant_id=tenant_id, name=name))[:MAX_SCALING_EVENTS]
    return render(request, "topic.html", tenant=tenant_id, topic=found, publish=publish, window=w, events=events)


@page
async def confirm_delete_topic(request: web.Request) -> web.StreamResponse:
    return await _confirm_page(request, "topic")


@page
async def delete_topic(request: web.Request) -> web.StreamResponse:
    return await _delete(request, "topic")


async def _confirm_page(request: web.Request, kind: Resource) -> web.StreamResponse:
    """Deleting asks for the name again (no script needed, keyboard first)."""
    tenant_id, name = await auth.named_resource(request, kind, "admin")
    _seen(request, await auth.authenticate(request))
    return render(request, "confirm_delete.html", tenant=tenant_id, kind=kind, name=name, error=None)


async def _delete(request: web.Request, kind: Resource) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, kind, "admin")
    _seen(request, await auth.authenticate(request))
    form = await request.post()
    if form.get("confirm_name") != name:
        error = f"Type the {kind}'s name, {name}, to delete it."
        return render(request, "confirm_delete.html", status=400, tenant=tenant_id, kind=kind, name=name, error=error)
    services = context.services(request)
    if kind == "topic":
        await services.topics.delete(tenant_id=tenant_id, name=name)
    else:
        await services.groups.delete(tenant_id=tenant_id, name=name)
    label = "Topic" if kind == "topic" else "Consumer group"
    return redirect(request, f"/console/t/{tenant_id}/{kind}s", flash=f"{label} {name} deleted.")


# --- consumer groups ------------------------------------------------------------------------------
@page
async def groups(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_resource(request, "group", None, None)
    _seen(request, principal)
    listed = auth.visible(principal, "group", await context.services(request).groups.list_groups(tenant_id=tenant_id))
    return render(request, "groups.html", tenant=tenant_id, groups=listed, retry_policies=RETRY_POLICIES)


@page
async def create_group(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await member(request)
    body = await forms.form_body(
        request,
        ("name", "retry_policy", "fixed_interval_ms", "max_retries", "consume_orderly", "description"),
        integers=("fixed_interval_ms", "max_retries"),
        booleans=("consume_orderly",),
    )
    name = auth.new_resource_name(principal, body, "group")
    _group, created = await context.services(request).groups.create(
        tenant_id=tenant_id, name=name, spec=group_handlers.spec_of(body, defaults=True)
    )
    done = f"Consumer group {name} created." if created else f"Consumer group {name} already exists as asked."
    return redirect(request, f"/console/t/{tenant_id}/groups/{name}", flash=done)


@page
async def confirm_delete_group(request: web.Request) -> web.StreamResponse:
    return await _confirm_page(request, "group")


@page
async def delete_group(request: web.Request) -> web.StreamResponse:
    return await _delete(request, "group")


# --- credentials and grants -----------------------------------------------------------------------
@page
async def credentials(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_admin(request)
    _seen(request, principal)
    listed = await context.services(request).credentials.list_credentials(tenant_id=tenant_id)
    for c in listed:
        c["grants_text"] = forms.grants_text(c["grants"])
    default = forms.grants_text(grants_to_json(default_grants()))
    return render(request, "credentials.html", tenant=tenant_id, credentials=listed, default_grants=default)


@page
async def create_credential(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_admin(request)
    _seen(request, principal)
    body = await forms.form_body(request, ("description",))
    grants = await forms.grants_field(request)
    made = await context.services(request).credentials.create(
        tenant_id=tenant_id, role="tenant", grants=grants, description=body.text("description", default="") or ""
    )
    # The secret is on this answer only (never stored in the clear, never shown again).
    return render(request, "secret_once.html", made=made, back=f"/console/t/{tenant_id}/credentials")


@page
async def revoke_credential(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_admin(request)
    _seen(request, principal)
    access_key = access_key_of(request)
    await context.services(request).credentials.revoke(tenant_id=tenant_id, access_key=access_key)
    return redirect(request, f"/console/t/{tenant_id}/credentials", flash=f"Credential {access_key} revoked.")


@page
async def set_grants(request: web.Request) -> web.StreamResponse:
    principal, tenant_id = await auth.tenant_admin(request)
    _seen(request, principal)
    access_key = access_key_of(request)
    grants = await forms.grants_field(request)
    if not grants:
        raise InvalidField("grants", "give at least one grant (revoke the credential to take every right away)")
    await context.services(request).credentials.set_grants(tenant_id=tenant_id, access_key=access_key, grants=grants)
    return redirect(request, f"/console/t/{tenant_id}/credentials", flash=f"Grants of {access_key} changed.")


# --- quotas and usage -----------------------------------------------------------------------------
CHARTED = {
    "requests_4k": ("Requests (4 KiB units)", str),
    "bytes_in": ("Published bytes", None),
    "bytes_out": ("Consumed bytes", None),
    "messages_in": ("Messages published", str),
    "messages_out": ("Messages consumed", str),
    "stored_bytes": ("Stored bytes", None),
    "tiered_bytes": ("Tiered bytes", None),
    "throttled_requests": ("Throttled requests", str),
    "forced_deleted_messages": ("Messages deleted inside retention", str),
}


def _series(buckets: list[dict[str, Any]], field: str) -> list[charts.Point]:
    return [charts.Point(dt.datetime.fromisoformat(b["start"]), int(b[field])) for b in buckets]


def _daily(buckets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hourly buckets summed per UTC day (gauges: the day's peak)."""
    days: dict[str, dict[str, Any]] = {}
    for b in buckets:
        day = b["start"][:10]
        d = days.setdefault(day, {"start": f"{day}T00:00:00+00:00", **dict.fromkeys(USAGE_FIELDS, 0)})
        for f in USAGE_FIELDS:
            d[f] = max(d[f], b[f]) if f in GAUGES else d[f] + b[f]
    return [days[k] for k in sorted(days)]


@page
async def usage(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await member(request)
    services = context.services(request)
    view = request.query.get("view", "minute")
    if view not in ("minute", "day"):
        raise InvalidField("view", "must be minute or day")
    end = dt.datetime.now(dt.UTC)
    span, granularity = (dt.timedelta(hours=1), "minute") if view == "minute" else (dt.timedelta(days=30), "hour")
    got = await services.usage.usage(tenant_id=tenant_id, start=end - span, end=end, granularity=granularity)
    buckets = got["buckets"] if view == "minute" else _daily(got["buckets"])
    drawn = []
    time_format = "%Y-%m-%d" if view == "day" else "%m-%d %H:%M"
    axis = (end - span, end)
    for field, (title, fmt) in CHARTED.items():
        points = _series(buckets, field)
        chart = charts.line_chart(title, points, fmt=fmt or human_bytes, time_format=time_format, span=axis)
        # Over the range: a counter's sum, a gauge's peak (what the usage API's totals say).
        total = max((p.value for p in points), default=0) if field in GAUGES else sum(p.value for p in points)
        drawn.append({
            "field": field, "title": title, "svg": chart, "points": points, "fmt": fmt or human_bytes,
            "total": total, "total_label": "peak" if field in GAUGES else "total",
        })  # fmt: skip
    quota = await services.tenants.quota(tenant_id=tenant_id)
    topics = await services.topics.list_topics(tenant_id=tenant_id)
    used = {
        "max_topics": len(topics),
        "max_queues": sum(p["queue_count"] for t in topics for p in t["placements"]),
        "storage_bytes": got["totals"].get("stored_bytes_max", 0),
        "max_tiered_bytes": got["totals"].get("tiered_bytes_max", 0),
    }
    return render(request, "usage.html", tenant=tenant_id, view=view, charts=drawn, quota=quota, used=used)
