"""Usage: brokers report records (``POST /internal/v1/usage``, idempotent on report_id); tenants
and operators read them aggregated per minute or hour."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField
from control_plane.names import BROKER_GROUP_NAME, TENANT_ID
from control_plane.request_body import BIGINT_FIELD_MAX, Body
from control_plane.routes import Route, json_response
from control_plane.services.usage import MAX_RANGE, USAGE_FIELDS

REPORT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_RECORDS = 1000
DEFAULT_RANGE = dt.timedelta(hours=24)
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
MAX_EPOCH_MS = (LATEST - EARLIEST) // dt.timedelta(milliseconds=1)


def parse_time(field: str, value: Any) -> dt.datetime:
    """ISO 8601 text (UTC when no offset) or integer epoch milliseconds, from ``EARLIEST`` (the
    Unix epoch) to ``LATEST``, which leaves room to compute a query's span."""
    out_of_range = InvalidField(field, f"must be within {EARLIEST.isoformat()}..{LATEST.isoformat()}")
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_EPOCH_MS:
            raise InvalidField(field, f"epoch milliseconds must be within 0..{MAX_EPOCH_MS}")
        return EARLIEST + dt.timedelta(milliseconds=value)
    if not isinstance(value, str):
        raise InvalidField(field, "must be an ISO 8601 time or epoch milliseconds")
    try:
        parsed = dt.datetime.fromisoformat(value)
        parsed = parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    except ValueError:
        raise InvalidField(field, "must be an ISO 8601 time such as 2024-05-01T12:00:00Z") from None
    except OverflowError:  # the offset moves it past year 1 or 9999
        raise out_of_range from None
    if not EARLIEST <= parsed <= LATEST:
        raise out_of_range
    return parsed


def _record(i: int, item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InvalidField(f"records[{i}]", "must be an object")
    body = Body(item, allowed=("report_id", "broker", "tenant", "minute", *USAGE_FIELDS))
    record: dict[str, Any] = {
        "report_id": body.name("report_id", REPORT_ID, what="1-128 characters of A-Za-z0-9._:-"),
        "broker": body.name("broker", BROKER_GROUP_NAME, what="a broker name"),
        "tenant": body.name("tenant", TENANT_ID, what="a tenant id"),
        "minute": parse_time("minute", body.data.get("minute")).replace(second=0, microsecond=0),
    }
    for f in USAGE_FIELDS:
        record[f] = body.integer(f, maximum=BIGINT_FIELD_MAX) or 0
    return record


async def report_usage(request: web.Request) -> web.StreamResponse:
    await auth.broker(request)
    body = await context.body(request, ("records",))
    records = body.data.get("records")
    if not isinstance(records, list) or len(records) > MAX_RECORDS:
        raise InvalidField("records", f"must be a list of at most {MAX_RECORDS} usage records")
    try:
        parsed = [_record(i, r) for i, r in enumerate(records)]
    except InvalidField as e:
        raise InvalidField(f"records: {e.field}", e.reason) from None
    return json_response(await context.services(request).usage.ingest(parsed))


async def get_usage(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_member(request)
    q = request.query
    granularity = q.get("granularity", "hour")
    if granularity not in MAX_RANGE:
        raise InvalidField("granularity", "must be minute or hour")
    end = parse_time("to", q["to"]) if "to" in q else dt.datetime.now(dt.UTC)
    start = parse_time("from", q["from"]) if "from" in q else end - DEFAULT_RANGE
    if start >= end:
        raise InvalidField("from", "must be before to")
    if end - start > MAX_RANGE[granularity]:
        raise InvalidField("to", f"a {granularity} query spans at most {MAX_RANGE[granularity]}")
    usage = await context.services(request).usage.usage(
        tenant_id=tenant_id, start=start, end=end, granularity=granularity
    )
    return json_response(usage)


RECORD_SCHEMA = {
    "type": "object",
    "properties": {
        "report_id": {
            "type": "string",
            "pattern": REPORT_ID.pattern,
            "description": "a resent id is not counted again",
        },
        "broker": {"type": "string"},
        "tenant": {"type": "string", "pattern": TENANT_ID.pattern},
        "minute": {"type": ["string", "integer"], "description": "ISO 8601 or epoch ms; floored to the minute"},
        **{f: {"type": "integer", "minimum": 0} for f in USAGE_FIELDS},
    },
    "required": ["report_id", "broker", "tenant", "minute"],
}
ROUTES = [
    Route(
        "POST",
        "/internal/v1/usage",
        report_usage,
        "Brokers report usage records (idempotent on report_id)",
        "broker",
        "usage",
        request_schema={
            "type": "object",
            "properties": {"records": {"type": "array", "items": RECORD_SCHEMA, "maxItems": MAX_RECORDS}},
            "required": ["records"],
        },
    ),
    Route(
        "GET",
        "/v1/tenants/{tenant}/usage",
        get_usage,
        "A tenant's usage per minute or hour",
        "tenant",
        "usage",
        query=("from", "to", "granularity"),
    ),
]
