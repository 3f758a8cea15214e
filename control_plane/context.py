"""Typed application keys, and the per-request accessors handlers use."""

from __future__ import annotations

from aiohttp import web

from control_plane.autoscaler import Autoscaler
from control_plane.login_limiter import LoginLimiter
from control_plane.reconciler import Reconciler
from control_plane.request_body import Body, read_json
from control_plane.services import Services

SERVICES = web.AppKey("services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]


OPENAPI = web.AppKey("openapi", dict)
RECONCILER = web.AppKey("reconciler", Reconciler)
AUTOSCALER = web.AppKey("autoscaler", Autoscaler)
LOGIN_LIMITER = web.AppKey("login_limiter", LoginLimiter)


async def body(request: web.Request, allowed: tuple[str, ...]) -> Body:
    """The request's JSON object, limited to the configured size, with only ``allowed`` fields."""
    limit = services(request).settings.json_body_limit_bytes
    return Body(await read_json(request, limit_bytes=limit), allowed=allowed)
