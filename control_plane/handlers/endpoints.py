"""Where clients connect: the name servers of the active broker groups, for any credential
(tenants need them to reach their topics; the fleet API itself is for operators)."""

from __future__ import annotations

from aiohttp import web

from control_plane import auth, context
from control_plane.routes import Route, json_response


async def get_endpoints(request: web.Request) -> web.StreamResponse:
    await auth.authenticate(request)
    groups = await context.services(request).fleet.list_groups()
    addrs = sorted({a for g in groups if g["status"] == "active" for a in g["namesrv_addrs"]})
    return json_response({"namesrv_addrs": addrs})


ROUTES = [
    Route(
        "GET",
        "/v1/endpoints",
        get_endpoints,
        "Name server addresses (host:port) of the active broker groups; any credential",
        "tenant",
        "endpoints",
    ),
]
