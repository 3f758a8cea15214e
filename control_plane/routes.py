"""Route: one HTTP endpoint with what the OpenAPI document says about it. Handler modules
export ``ROUTES``; the app registers them and ``openapi`` describes them, so the two cannot
disagree."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Auth = Literal["none", "client", "operator", "tenant", "broker"]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    auth: Auth
    tag: str
    request_schema: dict[str, Any] | None = None
    query: tuple[str, ...] = ()
    responses: dict[int, str] = field(default_factory=lambda: {200: "OK"})


def json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)
