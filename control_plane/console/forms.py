"""HTML forms into the API's typed ``Body``: the console checks a form with the very validators
the JSON API uses (names, ranges, choices), after turning its text fields into the JSON types.

Grants are written one a line, ``RESOURCE PATTERN ACTION[,ACTION…]`` (``topic orders* publish``),
and parsed into the API's grants list (``parse_grants``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from aiohttp import web

from control_plane.errors import InvalidField
from control_plane.grants import Grant, parse_grants
from control_plane.request_body import Body, check_text

MAX_GRANT_LINES = 64
MAX_FIELD_CHARS = 4096


async def form_body(
    request: web.Request,
    allowed: Collection[str],
    *,
    integers: Collection[str] = (),
    booleans: Collection[str] = (),
    lists: Collection[str] = (),
) -> Body:
    """The POSTed form's ``allowed`` fields (blank ones left out), ``integers`` parsed as
    integers, ``booleans`` (checkboxes) as true when sent and ``lists`` split at commas and
    white space (``a:1, b:2``); any other field is refused."""
    form = await request.post()
    data: dict[str, Any] = {}
    for key, raw in form.items():
        if key == "csrf" or key not in allowed or not isinstance(raw, str):
            continue
        value = raw.strip()
        if len(value) > MAX_FIELD_CHARS:
            raise InvalidField(key, f"at most {MAX_FIELD_CHARS} characters")
        if key in booleans:
            data[key] = value in ("on", "true", "1")
        elif not value:
            continue
        elif key in lists:
            data[key] = [item for item in value.replace(",", " ").split() if item]
        elif key in integers:
            try:
                data[key] = int(value)
            except ValueError:
                raise InvalidField(key, "must be a whole number") from None
        else:
            data[key] = value
    for key in booleans:
        data.setdefault(key, False)
    return Body(data, allowed=allowed)


def grants_text(grants: Iterable[Mapping[str, Any]]) -> str:
    return "\n".join(f"{g['resource']} {g['pattern']} {','.join(sorted(g['actions']))}" for g in grants)


async def grants_field(request: web.Request, *, field: str = "grants") -> list[Grant] | None:
    """The form's grants, one a line (None: the field left blank or out)."""
    value = (await request.post()).get(field)
    if not isinstance(value, str) or not value.strip():
        return None
    if len(value) > MAX_FIELD_CHARS:
        raise InvalidField(field, f"at most {MAX_FIELD_CHARS} characters")
    return parse_grants_text(value, field=field)


def parse_grants_text(text: str, *, field: str = "grants") -> list[Grant]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_GRANT_LINES:
        raise InvalidField(field, f"at most {MAX_GRANT_LINES} grants")
    items = []
    for i, line in enumerate(lines, 1):
        check_text(field, line, max_chars=256)
        parts = line.split()
        if len(parts) != 3:
            raise InvalidField(field, f"line {i}: write RESOURCE PATTERN ACTION[,ACTION], e.g. topic orders* publish")
        resource, pattern, actions = parts
        items.append({"resource": resource, "pattern": pattern, "actions": [a for a in actions.split(",") if a]})
    return parse_grants(items, field=field)
