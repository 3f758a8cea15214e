"""An operator's access pages: operator and broker credentials (create — the secret shown once —,
list, revoke) and the token signing key's rotation, through the services and checks the API's
``/v1/admin/credentials`` and ``/v1/admin/signing-keys/rotate`` use. The console refuses to
revoke the credential its own session was signed in with, so an operator cannot lock the
console out by mistake (the API, being explicit, allows it)."""

from __future__ import annotations

from aiohttp import web

from control_plane import context
from control_plane.console import forms
from control_plane.console.render import PRINCIPAL, page, redirect, render, require_operator
from control_plane.errors import InvalidField
from control_plane.handlers.credentials import access_key_of

ACCESS = "/console/ops/credentials"


@page
async def credentials(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    services = context.services(request)
    listed = await services.credentials.list_credentials(tenant_id=None)
    kids = [str(k.get("kid")) for k in (await services.tokens.jwks())["keys"]]
    return render(request, "ops_credentials.html", credentials=listed, kids=kids, own=request[PRINCIPAL].access_key)


@page
async def create_credential(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    body = await forms.form_body(request, ("role", "description"))
    role = body.choice("role", ("operator", "broker"))
    if role is None:
        raise InvalidField("role", "choose operator or broker")
    made = await context.services(request).credentials.create(
        tenant_id=None,
        role="operator" if role == "operator" else "broker",
        description=body.text("description", default="") or "",
    )
    response = render(request, "secret_once.html", made=made, back=ACCESS)
    response.headers["Cache-Control"] = "no-store"
    return response


@page
async def revoke_credential(request: web.Request) -> web.StreamResponse:
    await require_operator(request)
    access_key = access_key_of(request)
    if access_key == request[PRINCIPAL].access_key:
        raise InvalidField("access_key", "this session signed in with it: sign in with another credential to revoke it")
    await context.services(request).credentials.revoke(tenant_id=None, access_key=access_key)
    return redirect(request, ACCESS, flash=f"Credential {access_key} revoked.")


@page
async def rotate_signing_key(request: web.Request) -> web.StreamResponse:
    """A new token signing key; the old one still verifies for one token lifetime."""
    await require_operator(request)
    rotated = await context.services(request).tokens.rotate()
    return redirect(request, ACCESS, flash=f"Signing key {rotated['kid']} is now active.")
