"""A tenant's pages that need the brokers: consumer lag per queue, messages by key or id with
their trace, dead letters and resending them (``brokers.admin_client``: the session's own
token, so the brokers check the namespace too). The control plane checks first, as its API
does: the tenant, the grant on the named group or topic, and that the topic or group exists."""

from __future__ import annotations

import datetime as dt
from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.console import load_charts
from control_plane.console.brokers import admin_client
from control_plane.console.render import PRINCIPAL, page, redirect, render
from control_plane.errors import InvalidField
from control_plane.handlers.usage import parse_time
from control_plane.names import RESOURCE_NAME
from data_plane.cli.admin import message_dict
from data_plane.cli.dlq import dead_letter_dict
from data_plane.store.message import StoredMessage
from data_plane.tenancy.namespace import wire_name
from sdk.admin import message_id_forms

MAX_KEY_CHARS = 128
MAX_FOUND = 32
MAX_DEAD_LETTERS = 100
MAX_RESEND = 100


def _topic_param(value: str | None) -> str:
    if not value or not RESOURCE_NAME.fullmatch(value):
        raise InvalidField("topic", f"choose a topic (a name matching {RESOURCE_NAME.pattern})")
    return value


def _msg_id(value: str) -> str:
    if not any(message_id_forms(value)):
        raise InvalidField("msg_id", "a message id is 32 or 56 hex digits")
    return value.upper()


async def _topic_names(request: web.Request, tenant_id: str) -> list[str]:
    principal = request[PRINCIPAL]
    listed = await context.services(request).topics.list_topics(tenant_id=tenant_id)
    return [t["name"] for t in auth.visible(principal, "topic", listed)]


@page
async def group(request: web.Request) -> web.StreamResponse:
    """A group's settings, and with ``?topic=`` its lag on each queue of that topic (live, from
    the brokers) and its backlog and consume rate over the last hour or day (``?range=``, stored
    from the brokers' load reports)."""
    tenant_id, name = await auth.named_resource(request, "group", None)
    principal = await auth.authenticate(request)
    request[PRINCIPAL] = principal
    found = await context.services(request).groups.get(tenant_id=tenant_id, name=name)
    topic = request.query.get("topic") or None
    progress: list[dict[str, Any]] | None = None
    consumers: list[str] = []
    history: list[load_charts.Chart] = []
    step_s = 0
    w = load_charts.window(request)
    if topic is not None:
        topic = _topic_param(topic)
        auth.require_grant(principal, "topic", topic, None)
        await context.services(request).topics.get(tenant_id=tenant_id, name=topic)
        async with admin_client(request) as admin:
            rows = await admin.group_progress(wire_name(tenant_id, name), wire_name(tenant_id, topic))
            consumers = await admin.consumer_ids(wire_name(tenant_id, name), wire_name(tenant_id, topic))
        progress = [
            {"broker": r.broker_name, "queue_id": r.queue_id, "broker_offset": r.broker_offset,
             "consumer_offset": r.consumer_offset, "lag": r.lag}
            for r in rows
        ]  # fmt: skip
        lag = await context.services(request).load.group_lag(
            tenant_id=tenant_id, group=name, topic=topic, start=w.start, end=w.end
        )
        step_s = lag["step_s"]
        history = [
            load_charts.chart(f"Backlog of {name} on {topic}", lag["buckets"], "backlog", w),
            load_charts.chart(f"Consume rate of {name} on {topic} (messages/s)", lag["buckets"], "consume_rate", w),
        ]
    return render(
        request,
        "group.html",
        tenant=tenant_id,
        group=found,
        topics=await _topic_names(request, tenant_id),
        topic=topic,
        progress=progress,
        total_lag=sum(p["lag"] for p in progress or []),
        consumers=consumers,
        history=history,
        step_s=step_s,
        window=w,
    )


@page
async def messages(request: web.Request) -> web.StreamResponse:
    """Search a topic's messages by key (``?key=``), by id (``?msg_id=``), or by the time they
    were stored (``?from=&to=``, UTC, read through one of the tenant's groups: ``?group=``)."""
    principal, tenant_id = await auth.tenant_resource(request, "topic", None, None)
    request[PRINCIPAL] = principal
    q = request.query
    search = {k: (q.get(k) or "").strip() for k in ("key", "msg_id", "from", "to", "group")}
    topic = q.get("topic") or None
    found: list[dict[str, Any]] | None = None
    if topic is not None:
        topic = _topic_param(topic)
        auth.require_grant(principal, "topic", topic, None)
        await context.services(request).topics.get(tenant_id=tenant_id, name=topic)
        found = [_shown(message_dict(m)) for m in await _search(request, tenant_id, topic, search)]
    listed = await context.services(request).groups.list_groups(tenant_id=tenant_id)
    return render(
        request,
        "messages.html",
        tenant=tenant_id,
        topics=await _topic_names(request, tenant_id),
        groups=[g["name"] for g in auth.visible(principal, "group", listed)],
        topic=topic,
        search=search,
        found=found,
    )


async def _search(request: web.Request, tenant_id: str, topic: str, search: dict[str, str]) -> list[StoredMessage]:
    key, msg_id = search["key"], search["msg_id"]
    by_time = bool(search["from"] or search["to"])
    if [bool(key), bool(msg_id), by_time].count(True) != 1:
        raise InvalidField("key", "give a message key, a message id, or a time range (one of the three)")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidField("key", f"at most {MAX_KEY_CHARS} characters")
    wire = wire_name(tenant_id, topic)
    if by_time:
        begin, end = parse_time("from", search["from"]), parse_time("to", search["to"])
        if begin > end:
            raise InvalidField("from", "must not be after to")
        group = search["group"]
        if not RESOURCE_NAME.fullmatch(group):
            raise InvalidField("group", "choose the consumer group to read through")
        auth.require_grant(request[PRINCIPAL], "group", group, "subscribe")
        await context.services(request).groups.get(tenant_id=tenant_id, name=group)
    async with admin_client(request) as admin:
        if key:
            return await admin.query_by_key(wire, key, max_num=MAX_FOUND)
        if msg_id:
            return [await admin.view_message(_msg_id(msg_id), wire)]
        return await admin.messages_between(
            wire, wire_name(tenant_id, group), begin_ms=_ms(begin), end_ms=_ms(end), max_num=MAX_FOUND
        )


def _ms(t: dt.datetime) -> int:
    return int(t.timestamp() * 1000)


def _shown(d: dict[str, Any]) -> dict[str, Any]:
    """A message as the pages show it: the producer's id (UNIQ_KEY) as its id when it has one."""
    d["id"] = d["properties"].get("UNIQ_KEY") or d["msg_id"]
    return d


@page
async def trace(request: web.Request) -> web.StreamResponse:
    """One message, every field, and its trace (``?topic=&msg_id=``)."""
    principal, tenant_id = await auth.tenant_resource(request, "topic", None, None)
    request[PRINCIPAL] = principal
    topic = _topic_param(request.query.get("topic"))
    msg_id = _msg_id(request.query.get("msg_id", ""))
    auth.require_grant(principal, "topic", topic, None)
    await context.services(request).topics.get(tenant_id=tenant_id, name=topic)
    wire = wire_name(tenant_id, topic)
    async with admin_client(request) as admin:
        message = _shown(message_dict(await admin.view_message(msg_id, wire)))
        events = await admin.message_trace(wire, msg_id)
    return render(request, "trace.html", tenant=tenant_id, topic=topic, message=message, events=events)


@page
async def dead_letters(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "group", None)
    request[PRINCIPAL] = await auth.authenticate(request)
    await context.services(request).groups.get(tenant_id=tenant_id, name=name)
    async with admin_client(request) as admin:
        parked = await admin.dlq_messages(wire_name(tenant_id, name), max_num=MAX_DEAD_LETTERS)
    listed = [dead_letter_dict(m) for m in parked]
    return render(request, "dead_letters.html", tenant=tenant_id, group=name, messages=listed, limit=MAX_DEAD_LETTERS)


@page
async def resend(request: web.Request) -> web.StreamResponse:
    """Resend dead letters to their original topics: a row's button (``one``) or those ticked (``msg_id``)."""
    tenant_id, name = await auth.named_resource(request, "group", "admin")
    request[PRINCIPAL] = await auth.authenticate(request)
    form = await request.post()
    one = form.get("one")  # a row's own button: that message alone, whatever is ticked
    picked = [one] if isinstance(one, str) and one else form.getall("msg_id", [])
    chosen = [_msg_id(v) for v in picked if isinstance(v, str)]
    if not chosen:
        raise InvalidField("msg_id", "choose at least one dead letter to resend")
    if len(chosen) > MAX_RESEND:
        raise InvalidField("msg_id", f"at most {MAX_RESEND} at a time")
    group_wire = wire_name(tenant_id, name)
    async with admin_client(request) as admin:
        for msg_id in chosen:
            await admin.resend_dead_letter(group_wire, await admin.dlq_message(group_wire, msg_id))
    done = f"Resent {len(chosen)} dead letter{'s' if len(chosen) > 1 else ''} to the original topic."
    return redirect(request, f"/console/t/{tenant_id}/groups/{name}/dead-letters", flash=done)
