"""Rendering console pages, and what every console answer carries.

``page(handler)`` wraps each console handler: it hands the session cookie's token to the API's
checks (``auth.SESSION_TOKEN``), refuses a POST without the page's CSRF token, turns the API's
errors into pages (401: back to sign-in, the session cookie cleared; 403/404/409/422/…: the
error's message with its status) and adds the security headers below to every answer.
Templates are Jinja2 with autoescaping on: no value reaches HTML unescaped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web

from control_plane import auth
from control_plane.console import csrf, session
from control_plane.errors import ControlPlaneError, Unauthenticated
from control_plane.principal import Principal

log = logging.getLogger(__name__)

# Everything from this origin, nothing inline, no frames, forms only back here.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
ENV = web.AppKey("console_templates", jinja2.Environment)
PRINCIPAL = web.RequestKey("console_principal", Principal)  # who the page is for (its navigation)
PageHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("control_plane.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = human_bytes
    return env


def human_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def render(request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
    response = web.Response(status=status, content_type="text/html", charset="utf-8")
    context.setdefault("flash", session.take_flash(request, response))
    context.setdefault("principal", request.get(PRINCIPAL))
    text = request.app[ENV].get_template(template).render(csrf_token=csrf.token_for(request), **context)
    csrf.set_new_nonce(request, response)
    response.text = text
    return response


async def require_operator(request: web.Request) -> None:
    """The API's operator check; the operator is the page's principal."""
    request[PRINCIPAL] = await auth.operator(request)


def redirect(request: web.Request, location: str, *, flash: str | None = None) -> web.Response:
    """303 See Other to ``location`` (after a POST: the browser GETs it)."""
    response = web.Response(status=303, headers={"Location": location})
    if flash:
        session.flash(request, response, flash)
    return response


def sign_in_again(request: web.Request, message: str) -> web.Response:
    """To the sign-in page, the session cookie cleared; back here afterwards (a page, not a form's action)."""
    back = request.path_qs if request.method == "GET" else "/console/"
    response = redirect(request, f"/console/sign-in?next={quote(back, safe='')}", flash=message)
    session.end(request, response)
    return response


def page(handler: PageHandler) -> PageHandler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        token = session.token_of(request)
        if token is not None:
            request[auth.SESSION_TOKEN] = token
        try:
            if request.method == "POST":
                form = await request.post()
                submitted = form.get(csrf.FIELD)
                csrf.check(request, submitted if isinstance(submitted, str) else None)
            response = await handler(request)
        except Unauthenticated as e:
            if token is None:
                response = sign_in_again(request, "Sign in to continue.")
            else:
                log.info("console session refused: %s", e.code)
                response = sign_in_again(request, "Your session has ended (expired or revoked): sign in again.")
        except ControlPlaneError as e:
            response = render(request, "error.html", status=e.status, code=e.code, message=e.message)
        except ConsoleUnavailable as e:
            response = render(request, "error.html", status=502, code="broker_unavailable", message=str(e))
        response.headers.update(SECURITY_HEADERS)
        return response

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


class ConsoleUnavailable(Exception):
    """What the console needs from the brokers could not be had (the message says why)."""
