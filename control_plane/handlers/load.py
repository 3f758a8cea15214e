"""Load: master brokers report their tenants' load (``POST /internal/v1/load``); tenants read it
back as time buckets — a topic's publish rate, a consumer group's consume rate and backlog
(docs/elasticity.md)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField, InvalidRequest
from control_plane.handlers.usage import parse_time
from control_plane.names import BROKER_GROUP_NAME, RESOURCE_NAME, TENANT_ID
from control_plane.request_body import Body
from control_plane.routes import Route, json_response
from control_plane.services.load import MAX_RANGE

MAX_ITEMS = 2000  # topics, and groups, in one report
MAX_QUEUES = 1024  # queues of one topic on one broker
MAX_QUEUE_OFFSET = 2**52  # a queue's offsets (so that a topic's sums stay within a bigint)
MAX_REFUSED = 2**40
CLOCK_SKEW = dt.timedelta(minutes=5)  # how far ahead of the control plane a report's time may be
DEFAULT_RANGE = dt.timedelta(hours=1)
TOPIC_QUEUE = ("id", "max_offset", "perm")
GROUP_QUEUE = ("id", "committed", "max_offset")


def _queues(value: Any, fields: tuple[str, ...]) -> list[dict[str, int]]:
    if not isinstance(value, list) or len(value) > MAX_QUEUES:
        raise InvalidField("queues", f"must be a list of at most {MAX_QUEUES} queues")
    out: list[dict[str, int]] = []
    seen: set[int] = set()
    for i, item in enumerate(value):
        where = f"queues[{i}]"
        try:
            body = _object(item, fields)
            queue = {"id": body.required_integer("id", maximum=MAX_QUEUES - 1)}
            for f in fields[1:]:
                if f == "perm":
                    queue[f] = body.integer(f, maximum=7) or 0
                else:
                    queue[f] = body.required_integer(f, maximum=MAX_QUEUE_OFFSET)
        except InvalidField as e:
            raise InvalidField(f"{where}.{e.field}", e.reason) from None
        except InvalidRequest as e:
            raise InvalidField(where, e.message) from None
        if queue["id"] in seen:
            raise InvalidField(f"{where}.id", f"queue {queue['id']} is listed twice")
        seen.add(queue["id"])
        out.append(queue)
    return out


def _object(item: Any, fields: tuple[str, ...]) -> Body:
    if not isinstance(item, dict):
        raise InvalidRequest("must be an object")
    return Body(item, allowed=fields)


NAMES = {
    "tenant": (TENANT_ID, "a tenant id"),
    "group": (RESOURCE_NAME, "a consumer group name"),
    "topic": (RESOURCE_NAME, "a topic name"),
}


def _entry(
    item: Any, names: tuple[str, ...], queue_fields: tuple[str, ...], *more: str
) -> tuple[Body, dict[str, Any], list[dict[str, int]]]:
    """A report entry's body, its names (checked) and its queues."""
    body = _object(item, (*names, "queues", *more))
    queues = _queues(body.data.get("queues"), queue_fields)
    return body, {n: body.name(n, NAMES[n][0], what=NAMES[n][1]) for n in names}, queues


def _topic(item: Any) -> dict[str, Any]:
    body, entry, queues = _entry(item, ("tenant", "topic"), TOPIC_QUEUE, "refused")
    entry["appended"] = sum(q["max_offset"] for q in queues)
    entry["queues"] = len(queues)
    entry["refused"] = body.integer("refused", maximum=MAX_REFUSED) or 0
    return entry


def _group(item: Any) -> dict[str, Any]:
    _body, entry, queues = _entry(item, ("tenant", "group", "topic"), GROUP_QUEUE)
    entry["committed"] = sum(q["committed"] for q in queues)
    entry["backlog"] = sum(max(0, q["max_offset"] - q["committed"]) for q in queues)
    return entry


def _items(body: Body, name: str, parse: Any, key: tuple[str, ...]) -> list[dict[str, Any]]:
    value = body.data.get(name, [])
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise InvalidField(name, f"must be a list of at most {MAX_ITEMS} entries")
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, ...]] = set()
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        try:
            parsed = parse(item)
        except InvalidField as e:
            raise InvalidField(f"{where}.{e.field}", e.reason) from None
        except InvalidRequest as e:
            raise InvalidField(where, e.message) from None
        k = tuple(parsed[f] for f in key)
        if k in seen:
            raise InvalidField(where, f"{'/'.join(k)} is listed twice")
        seen.add(k)
        out.append(parsed)
    return out


async def report_load(request: web.Request) -> web.StreamResponse:
    principal = await auth.broker(request)
    body = await context.body(request, ("broker", "at", "topics", "groups"))
    services = context.services(request)
    broker = body.name("broker", BROKER_GROUP_NAME, what="a broker group name")
    if not body.has("at"):
        raise InvalidField("at", "is required (epoch milliseconds or ISO 8601)")
    at = parse_time("at", body.data["at"])
    now = dt.datetime.now(dt.UTC)
    if not now - services.load.history <= at <= now + CLOCK_SKEW:
        raise InvalidField("at", f"must be within the last {services.load.history} (and not ahead of now)")
    topics = _items(body, "topics", _topic, ("tenant", "topic"))
    groups = _items(body, "groups", _group, ("tenant", "group", "topic"))
    stored = await services.load.ingest(
        access_key=principal.access_key, broker=broker, at=at, topics=topics, groups=groups
    )
    return json_response(stored)


def _range(request: web.Request) -> tuple[dt.datetime, dt.datetime]:
    q = request.query
    end = parse_time("to", q["to"]) if "to" in q else dt.datetime.now(dt.UTC)
    start = parse_time("from", q["from"]) if "from" in q else end - DEFAULT_RANGE
    if start >= end:
        raise InvalidField("from", "must be before to")
    if end - start > MAX_RANGE:
        raise InvalidField("to", f"a query spans at most {MAX_RANGE}")
    return start, end


async def group_lag(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "group", None)
    topic = request.query.get("topic") or None
    if topic is not None:
        if not RESOURCE_NAME.fullmatch(topic):
            raise InvalidField("topic", f"must match {RESOURCE_NAME.pattern}")
        auth.require_grant(await auth.authenticate(request), "topic", topic, None)
    start, end = _range(request)
    lag = await context.services(request).load.group_lag(
        tenant_id=tenant_id, group=name, topic=topic, start=start, end=end
    )
    return json_response(lag)


async def topic_load(request: web.Request) -> web.StreamResponse:
    tenant_id, name = await auth.named_resource(request, "topic", None)
    start, end = _range(request)
    return json_response(
        await context.services(request).load.topic_load(tenant_id=tenant_id, topic=name, start=start, end=end)
    )


async def broker_group_load(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    name = auth.path_name(request, "group", BROKER_GROUP_NAME)
    start, end = _range(request)
    return json_response(await context.services(request).load.broker_group_load(group=name, start=start, end=end))


def _queue_schema(fields: tuple[str, ...]) -> dict[str, Any]:
    props: dict[str, Any] = {"id": {"type": "integer", "minimum": 0, "maximum": MAX_QUEUES - 1}}
    for f in fields[1:]:
        props[f] = (
            {"type": "integer", "minimum": 0, "maximum": 7, "description": "4 read, 2 write"}
            if f == "perm"
            else {"type": "integer", "minimum": 0, "maximum": MAX_QUEUE_OFFSET}
        )
    required = [f for f in fields if f != "perm"]
    return {
        "type": "array",
        "maxItems": MAX_QUEUES,
        "items": {"type": "object", "properties": props, "required": required},
    }


def _entries_schema(names: tuple[str, ...], queue_fields: tuple[str, ...], **more: Any) -> dict[str, Any]:
    props: dict[str, Any] = {n: {"type": "string", "pattern": NAMES[n][0].pattern} for n in names}
    item = {
        "type": "object",
        "properties": {**props, "queues": _queue_schema(queue_fields), **more},
        "required": [*names, "queues"],
    }
    return {"type": "array", "maxItems": MAX_ITEMS, "items": item}


REPORT_SCHEMA = {
    "type": "object",
    "properties": {
        "broker": {"type": "string", "pattern": BROKER_GROUP_NAME.pattern, "description": "the broker group"},
        "at": {"type": ["integer", "string"], "description": "epoch ms or ISO 8601: when the broker measured"},
        "topics": _entries_schema(
            ("tenant", "topic"),
            TOPIC_QUEUE,
            refused={"type": "integer", "minimum": 0, "description": "sends and pulls refused since the last report"},
        ),
        "groups": _entries_schema(("tenant", "group", "topic"), GROUP_QUEUE),
    },
    "required": ["broker", "at"],
}
ROUTES = [
    Route(
        "POST",
        "/internal/v1/load",
        report_load,
        "A master broker's load report: its tenant topics' max offsets and groups' committed offsets",
        "broker",
        "load",
        request_schema=REPORT_SCHEMA,
        responses={200: "stored (topics not placed on the broker group are ignored)", 403: "another group's"},
    ),
    Route(
        "GET",
        "/v1/tenants/{tenant}/groups/{name}/lag",
        group_lag,
        "A consumer group's backlog and consume rate over time (of one topic, or all)",
        "tenant",
        "groups",
        query=("topic", "from", "to"),
    ),
    Route(
        "GET",
        "/v1/tenants/{tenant}/topics/{name}/load",
        topic_load,
        "A topic's publish rate and refusals over time",
        "tenant",
        "topics",
        query=("from", "to"),
    ),
    Route(
        "GET",
        "/v1/fleet/broker-groups/{group}/load",
        broker_group_load,
        "A broker group's publish rate and refusals over time (its tenant topics summed), and its max_msgs_per_s",
        "operator",
        "fleet",
        query=("from", "to"),
    ),
]
