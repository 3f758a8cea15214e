"""Signing in and out: a client id and secret become the token the token endpoint would issue
(``CredentialsService.login``, behind the same failed-login limiter), kept as the session."""

from __future__ import annotations

from aiohttp import web

from control_plane import auth, context
from control_plane.console import session
from control_plane.console.render import page, redirect, render
from control_plane.errors import InvalidField
from control_plane.handlers.public import MAX_CLIENT_ID_CHARS, MAX_CLIENT_SECRET_CHARS
from control_plane.request_body import check_text
from control_plane.services.credentials import InvalidClient


def _next(request: web.Request, value: object) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if isinstance(value, str) and value.startswith("/console/") and "//" not in value and "\\" not in value:
        return value
    return "/console/"


@page
async def home(request: web.Request) -> web.StreamResponse:
    """The signed-in user's start page: a tenant's topics, an operator's tenants."""
    if session.token_of(request) is None:
        return redirect(request, "/console/sign-in")
    principal = await auth.authenticate(request)
    if principal.is_operator:
        return redirect(request, "/console/ops/tenants")
    if principal.role != "tenant":
        return render(
            request, "error.html", status=403, code="forbidden", message="the console is for tenants and operators"
        )
    return redirect(request, f"/console/t/{principal.tenant}/topics")


@page
async def sign_in_form(request: web.Request) -> web.StreamResponse:
    return render(request, "sign_in.html", next=_next(request, request.query.get("next")), error=None)


@page
async def sign_in(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    client_id, secret = form.get("client_id"), form.get("client_secret")
    target = _next(request, form.get("next"))
    if not isinstance(client_id, str) or not isinstance(secret, str) or not client_id or not secret:
        return render(request, "sign_in.html", status=400, next=target, error="Enter the client id and the secret.")
    try:
        check_text("client_id", client_id, max_chars=MAX_CLIENT_ID_CHARS)
        check_text("client_secret", secret, max_chars=MAX_CLIENT_SECRET_CHARS)
    except InvalidField as e:
        return render(request, "sign_in.html", status=400, next=target, error=e.message)
    limiter = request.app[context.LOGIN_LIMITER]
    address = request.remote or ""
    wait_s = limiter.retry_after_s(address, client_id)
    if wait_s:
        return render(
            request, "sign_in.html", status=429, next=target, error=f"Too many failed sign-ins: retry in {wait_s} s."
        )
    try:
        token, lifetime_s = await context.services(request).credentials.login(client_id, secret)
    except InvalidClient:
        limiter.failed(address, client_id)
        error = "Unknown client id, wrong secret, revoked credential or suspended tenant."
        return render(request, "sign_in.html", status=401, next=target, error=error)
    response = redirect(request, target)
    session.start(request, response, token, lifetime_s)
    return response


@page
async def sign_out(request: web.Request) -> web.StreamResponse:
    response = redirect(request, "/console/sign-in", flash="Signed out.")
    session.end(request, response)
    return response
