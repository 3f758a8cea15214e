"""The web console, served by the control plane at ``/console/`` (docs/console.md).

Server-rendered pages (Jinja2) over the same services and the same authorization checks as the
HTTP API, with a little progressive JavaScript (``static/console.js``) and every asset served
from this package. ``setup(app, master_key)`` registers the routes; ``ROUTES`` lists them.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from control_plane.console import (
    access_pages,
    csrf,
    fleet_pages,
    message_pages,
    operator_pages,
    render,
    sign_in,
    tenant_pages,
)
from control_plane.console.render import PageHandler

STATIC_DIR = Path(__file__).parent / "static"
T = tenant_pages.T
OPS = operator_pages.OPS
FLEET = fleet_pages.FLEET
ACCESS = access_pages.ACCESS
ROUTES: list[tuple[str, str, PageHandler]] = [
    ("GET", "/console/", sign_in.home),
    ("GET", "/console/sign-in", sign_in.sign_in_form),
    ("POST", "/console/sign-in", sign_in.sign_in),
    ("POST", "/console/sign-out", sign_in.sign_out),
    ("GET", T + "/topics", tenant_pages.topics),
    ("POST", T + "/topics", tenant_pages.create_topic),
    ("GET", T + "/topics/{name}", tenant_pages.topic),
    ("GET", T + "/topics/{name}/delete", tenant_pages.confirm_delete_topic),
    ("POST", T + "/topics/{name}/delete", tenant_pages.delete_topic),
    ("GET", T + "/groups", tenant_pages.groups),
    ("POST", T + "/groups", tenant_pages.create_group),
    ("GET", T + "/groups/{name}", message_pages.group),
    ("GET", T + "/groups/{name}/delete", tenant_pages.confirm_delete_group),
    ("POST", T + "/groups/{name}/delete", tenant_pages.delete_group),
    ("GET", T + "/groups/{name}/dead-letters", message_pages.dead_letters),
    ("POST", T + "/groups/{name}/dead-letters/resend", message_pages.resend),
    ("GET", T + "/messages", message_pages.messages),
    ("GET", T + "/messages/trace", message_pages.trace),
    ("GET", T + "/credentials", tenant_pages.credentials),
    ("POST", T + "/credentials", tenant_pages.create_credential),
    ("POST", T + "/credentials/{access_key}/revoke", tenant_pages.revoke_credential),
    ("POST", T + "/credentials/{access_key}/grants", tenant_pages.set_grants),
    ("GET", T + "/usage", tenant_pages.usage),
    ("GET", OPS + "/tenants", operator_pages.tenants),
    ("POST", OPS + "/tenants", operator_pages.create_tenant),
    ("GET", OPS + "/tenants/{tenant}", operator_pages.tenant),
    ("POST", OPS + "/tenants/{tenant}/suspend", operator_pages.suspend),
    ("POST", OPS + "/tenants/{tenant}/resume", operator_pages.resume),
    ("POST", OPS + "/tenants/{tenant}/plan", operator_pages.change_plan),
    ("POST", OPS + "/tenants/{tenant}/quota", operator_pages.put_quota),
    ("GET", OPS + "/plans", operator_pages.plans),
    ("GET", OPS + "/new-plan", operator_pages.new_plan),
    ("GET", OPS + "/plans/{plan}", operator_pages.plan),
    ("POST", OPS + "/plans/{plan}", operator_pages.put_plan),
    ("GET", FLEET, fleet_pages.fleet),
    ("POST", FLEET, fleet_pages.create_group),
    ("GET", FLEET + "/{group}", fleet_pages.group),
    ("POST", FLEET + "/{group}", fleet_pages.update_group),
    ("POST", FLEET + "/{group}/delete", fleet_pages.delete_group),
    ("POST", FLEET + "/{group}/hosts", fleet_pages.add_host),
    ("POST", FLEET + "/{group}/hosts/{host}/credential", fleet_pages.issue_host_credential),
    ("POST", FLEET + "/{group}/hosts/{host}/revoke", fleet_pages.revoke_host_credential),
    ("GET", ACCESS, access_pages.credentials),
    ("POST", ACCESS, access_pages.create_credential),
    ("POST", ACCESS + "/{access_key}/revoke", access_pages.revoke_credential),
    ("POST", OPS + "/signing-keys/rotate", access_pages.rotate_signing_key),
]


async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["file"]
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise web.HTTPNotFound()
    response = web.FileResponse(path, headers={"Cache-Control": "max-age=300", **_static_headers()})
    return response


def _static_headers() -> dict[str, str]:
    return {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": render.CSP}


async def _to_console(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


def setup(app: web.Application, master_key: bytes) -> None:
    app[render.ENV] = render.environment()
    app[csrf.KEY] = csrf.derive_key(master_key)
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    app.router.add_route("GET", "/console", _to_console)
    app.router.add_route("GET", "/console/static/{file}", _static)
