"""Credentials and ACLs: tenants manage their own (namespace admins only); operators manage
operator and broker credentials and rotate the token signing key. A secret is in the answer to
the POST that made it, and nowhere else, ever."""

from __future__ import annotations

from aiohttp import web

from control_plane import auth, context
from control_plane.errors import InvalidField
from control_plane.grants import ACTIONS, RESOURCES, parse_grants
from control_plane.routes import Route, json_response

ACCESS_KEY_MAX_CHARS = 64


def access_key_of(request: web.Request) -> str:
    access_key = request.match_info["access_key"]
    if not access_key.isalnum() or len(access_key) > ACCESS_KEY_MAX_CHARS:
        raise InvalidField("access_key", "must be an access key")
    return access_key


async def create_credential(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_admin(request)
    body = await context.body(request, ("grants", "description"))
    grants = parse_grants(body.data["grants"]) if body.has("grants") else None
    made = await context.services(request).credentials.create(
        tenant_id=tenant_id, role="tenant", grants=grants, description=body.text("description", default="") or ""
    )
    return json_response(made, status=201, headers={"Cache-Control": "no-store"})


async def list_credentials(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_admin(request)
    return json_response(
        {"credentials": await context.services(request).credentials.list_credentials(tenant_id=tenant_id)}
    )


async def revoke_credential(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_admin(request)
    revoked = await context.services(request).credentials.revoke(tenant_id=tenant_id, access_key=access_key_of(request))
    return json_response(revoked)


async def put_grants(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_admin(request)
    body = await context.body(request, ("grants",))
    if not body.has("grants"):
        raise InvalidField("grants", "is required")
    updated = await context.services(request).credentials.set_grants(
        tenant_id=tenant_id, access_key=access_key_of(request), grants=parse_grants(body.data["grants"])
    )
    return json_response(updated)


async def list_acls(request: web.Request) -> web.StreamResponse:
    _principal, tenant_id = await auth.tenant_admin(request)
    credentials = await context.services(request).credentials.list_credentials(tenant_id=tenant_id)
    acls = [{"access_key": c["access_key"], "grants": c["grants"]} for c in credentials if c["status"] == "active"]
    return json_response({"acls": acls})


async def create_admin_credential(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    body = await context.body(request, ("role", "description"))
    role = body.choice("role", ("operator", "broker"))
    if role is None:
        raise InvalidField("role", "is required")
    made = await context.services(request).credentials.create(
        tenant_id=None, role="operator" if role == "operator" else "broker", description=body.text("description") or ""
    )
    return json_response(made, status=201, headers={"Cache-Control": "no-store"})


async def list_admin_credentials(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response({"credentials": await context.services(request).credentials.list_credentials(tenant_id=None)})


async def revoke_admin_credential(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    revoked = await context.services(request).credentials.revoke(tenant_id=None, access_key=access_key_of(request))
    return json_response(revoked)


async def rotate_signing_key(request: web.Request) -> web.StreamResponse:
    await auth.operator(request)
    return json_response(await context.services(request).tokens.rotate())


GRANTS_SCHEMA = {
    "type": "array",
    "maxItems": 64,
    "items": {
        "type": "object",
        "properties": {
            "resource": {"type": "string", "enum": list(RESOURCES)},
            "pattern": {"type": "string", "description": "a name, a prefix followed by *, or *"},
            "actions": {"type": "array", "items": {"type": "string", "enum": list(ACTIONS)}, "minItems": 1},
        },
        "required": ["resource", "pattern", "actions"],
    },
}
CREDENTIAL_SCHEMA = {
    "type": "object",
    "properties": {
        "grants": {**GRANTS_SCHEMA, "description": "default: topic * publish+subscribe+admin, group * subscribe+admin"},
        "description": {"type": "string", "maxLength": 256},
    },
}
ADMIN_CREDENTIAL_SCHEMA = {
    "type": "object",
    "properties": {"role": {"type": "string", "enum": ["operator", "broker"]}, "description": {"type": "string"}},
    "required": ["role"],
}
P = "/v1/tenants/{tenant}/credentials"
ROUTES = [
    Route(
        "POST",
        P,
        create_credential,
        "Issue a credential; the secret is shown in this answer only",
        "tenant",
        "credentials",
        request_schema=CREDENTIAL_SCHEMA,
        responses={201: "created, with secret"},
    ),
    Route("GET", P, list_credentials, "List credentials (never secrets)", "tenant", "credentials"),
    Route(
        "DELETE",
        P + "/{access_key}",
        revoke_credential,
        "Revoke a credential (tokens refused at once)",
        "tenant",
        "credentials",
    ),
    Route(
        "PUT",
        P + "/{access_key}/grants",
        put_grants,
        "Replace a credential's grants",
        "tenant",
        "credentials",
        request_schema={"type": "object", "properties": {"grants": GRANTS_SCHEMA}, "required": ["grants"]},
    ),
    Route("GET", "/v1/tenants/{tenant}/acls", list_acls, "Grants of every active credential", "tenant", "credentials"),
    Route(
        "POST",
        "/v1/admin/credentials",
        create_admin_credential,
        "Issue an operator or broker credential",
        "operator",
        "credentials",
        request_schema=ADMIN_CREDENTIAL_SCHEMA,
        responses={201: "created, with secret"},
    ),
    Route(
        "GET",
        "/v1/admin/credentials",
        list_admin_credentials,
        "List operator and broker credentials",
        "operator",
        "credentials",
    ),
    Route(
        "DELETE",
        "/v1/admin/credentials/{access_key}",
        revoke_admin_credential,
        "Revoke an operator or broker credential",
        "operator",
        "credentials",
    ),
    Route(
        "POST",
        "/v1/admin/signing-keys/rotate",
        rotate_signing_key,
        "Rotate the token signing key (the old key verifies for one more token lifetime)",
        "operator",
        "auth",
    ),
]
