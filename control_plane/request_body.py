"""Reading request bodies: size limit, JSON parsing with clear errors, and typed field access.

``read_json`` answers 413 ``payload_too_large`` past the limit, 400 ``malformed_json`` for
anything that is not a JSON object and 400 ``invalid_field`` for a NUL character in any string
or key at any depth (PostgreSQL text and jsonb cannot hold NUL); ``Body`` refuses unknown fields
and checks each field's type, range and pattern (400 ``invalid_field`` naming the field). Free
text may hold any printable character, quotes and semicolons included (SQL is always
parameterized), but no control characters.

An integer field's range is what its column holds: ``Body.integer`` defaults to PostgreSQL
``integer`` (``INTEGER_MAX``); a field stored in a ``bigint`` column passes ``BIGINT_FIELD_MAX``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import orjson
from aiohttp import web

from control_plane.errors import InvalidField, InvalidRequest, MalformedJson, PayloadTooLarge

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
MAX_TEXT_CHARS = 256
ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]{1,253}:\d{1,5}$")
INTEGER_MAX = 2**31 - 1  # the largest PostgreSQL ``integer``
BIGINT_FIELD_MAX = 2**62  # the bound of fields stored in ``bigint`` columns (which hold 2**63 - 1)
COLUMN_MAX = {"integer": INTEGER_MAX, "bigint": BIGINT_FIELD_MAX}


async def read_bytes(request: web.Request, *, limit_bytes: int) -> bytes:
    if request.content_length is not None and request.content_length > limit_bytes:
        raise PayloadTooLarge(request.content_length, limit_bytes)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(None, limit_bytes) from None
    if len(raw) > limit_bytes:
        raise PayloadTooLarge(len(raw), limit_bytes)
    return raw


async def read_json(request: web.Request, *, limit_bytes: int) -> dict[str, Any]:
    raw = await read_bytes(request, limit_bytes=limit_bytes)
    if not raw.strip():
        raise MalformedJson("the request body is empty; a JSON object is expected")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise MalformedJson(f"the request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise MalformedJson(f"the request body must be a JSON object, not {type(value).__name__}")
    refuse_nul(value)
    return value


def refuse_nul(document: dict[str, Any]) -> None:
    """InvalidField naming, by its path (``records[0].report_id``), a string or key holding NUL.
    The walk keeps its own stack, so JSON nested deeper than Python's recursion limit is walked."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise InvalidField(where, "must not contain NUL characters")
        elif isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{key}" if where else key
                if "\x00" in key:
                    raise InvalidField(path, "names must not contain NUL characters")
                stack.append((path, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def check_text(field: str, value: str, *, max_chars: int = MAX_TEXT_CHARS) -> str:
    if len(value) > max_chars:
        raise InvalidField(field, f"at most {max_chars} characters")
    if CONTROL_CHARS.search(value):
        raise InvalidField(field, "must not contain control characters")
    return value


class Body:
    """Typed access to a JSON object's fields; ``allowed`` lists every field it may hold."""

    def __init__(self, data: dict[str, Any], *, allowed: Collection[str]) -> None:
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise InvalidRequest(f"unknown fields: {', '.join(unknown)}", unknown_fields=unknown)
        self.data = data

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def _get(self, name: str, required: bool) -> Any:
        if name not in self.data or self.data[name] is None:
            if required:
                raise InvalidField(name, "is required")
            return None
        return self.data[name]

    def text(self, name: str, *, default: str | None = None, max_chars: int = MAX_TEXT_CHARS) -> str | None:
        value = self._get(name, False)
        if value is None:
            return default
        if not isinstance(value, str):
            raise InvalidField(name, "must be a string")
        return check_text(name, value, max_chars=max_chars)

    def name(self, name: str, pattern: re.Pattern[str], *, what: str) -> str:
        value = self._get(name, True)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise InvalidField(name, f"must be {what}")
        return value

    def choice(self, name: str, choices: Collection[str], *, default: str | None = None) -> str | None:
        value = self._get(name, False)
        if value is None:
            return default
        if value not in choices:
            raise InvalidField(name, f"must be one of {', '.join(choices)}")
        return str(value)

    def integer(self, name: str, *, minimum: int = 0, maximum: int = INTEGER_MAX, required: bool = False) -> int | None:
        """``maximum``: what the field's column holds (``integer`` unless the caller says otherwise)."""
        value = self._get(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidField(name, "must be an integer")
        if not minimum <= value <= maximum:
            raise InvalidField(name, f"must be within {minimum}..{maximum}")
        return value

    def required_integer(self, name: str, *, minimum: int = 0, maximum: int = INTEGER_MAX) -> int:
        value = self.integer(name, minimum=minimum, maximum=maximum, required=True)
        assert value is not None
        return value

    def boolean(self, name: str, *, default: bool | None = None) -> bool | None:
        value = self._get(name, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidField(name, "must be true or false")
        return value

    def addresses(self, name: str, *, max_items: int = 16) -> list[str]:
        value = self._get(name, False)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise InvalidField(name, f"must be a list of at most {max_items} HOST:PORT addresses")
        for i, a in enumerate(value):
            if not isinstance(a, str) or not ADDRESS.fullmatch(a):
                raise InvalidField(f"{name}[{i}]", "must be HOST:PORT")
        return list(value)
