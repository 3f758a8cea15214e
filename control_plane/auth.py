"""API authentication and authorization.

Every API request but /healthz, /openapi.json, /.well-known/jwks.json and /oauth/token carries
``Authorization: Bearer <jwt>`` minted by this control plane. A missing header or another scheme
is 401; a token that is not RFC 6750 token characters (``b64token``) or longer than
``MAX_TOKEN_CHARS`` is a malformed request, 400 ``invalid_field`` naming ``Authorization``
(never echoing the token); a well-formed token that does not verify is 401. Rules:

- operator endpoints: role ``operator``;
- ``/v1/tenants/{tenant}/...``: role ``operator``, or role ``tenant`` with ``tenant`` claim equal
  to ``{tenant}`` (another tenant's token gets 403 whether or not ``{tenant}`` exists) whose
  grants allow it: any action on a topic/group to read it, ``admin`` on it to write it, and
  namespace admin (admin on topic ``*`` and group ``*``) for credentials and ACLs;
- ``/internal/...``: role ``broker`` (or operator).
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from control_plane import context
from control_plane.errors import Forbidden, InvalidField, Unauthenticated
from control_plane.grants import Action, Resource, allows, is_tenant_admin
from control_plane.names import RESOURCE_NAME, TENANT_ID
from control_plane.principal import Principal
from control_plane.request_body import Body

MAX_TOKEN_CHARS = 8192
B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750 §2.1; a JWT is base64url parts and dots


# The console's pages (control_plane/console) put their session's token here after reading it
# from the session cookie; the API's routes never read cookies, so only Authorization counts there.
SESSION_TOKEN = web.RequestKey("console_session_token", str)


def bearer_token(request: web.Request) -> str:
    """The request's token: the console session's, else the Authorization header's, checked."""
    session = request.get(SESSION_TOKEN)
    if isinstance(session, str):
        return session
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("an Authorization: Bearer <token> header is required")
    check_token_shape("Authorization", token)
    return token


def check_token_shape(field: str, token: str) -> None:
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidField(field, f"the bearer token is longer than {MAX_TOKEN_CHARS} characters")
    if not B64TOKEN.fullmatch(token):
        reason = "the bearer token may hold only A-Z a-z 0-9 - . _ ~ + / and trailing = (RFC 6750)"
        raise InvalidField(field, reason)


async def authenticate(request: web.Request) -> Principal:
    token = bearer_token(request)
    services = context.services(request)
    principal = await services.tokens.verify(token)
    return await services.credentials.check_current(principal)


async def operator(request: web.Request) -> Principal:
    principal = await authenticate(request)
    if not principal.is_operator:
        raise Forbidden("this endpoint is for operators")
    return principal


async def broker(request: web.Request) -> Principal:
    principal = await authenticate(request)
    if principal.role not in ("broker", "operator"):
        raise Forbidden("this endpoint is for broker hosts")
    return principal


def path_name(request: web.Request, key: str, pattern: re.Pattern[str]) -> str:
    """The URL's ``{key}``, which must match ``pattern`` (else 400 ``invalid_field`` naming ``key``)."""
    value = request.match_info[key]
    if not pattern.fullmatch(value):
        raise InvalidField(key, f"must match {pattern.pattern}")
    return value


def tenant_id_of(request: web.Request) -> str:
    return path_name(request, "tenant", TENANT_ID)


def resource_name_of(request: web.Request, key: str = "name") -> str:
    return path_name(request, key, RESOURCE_NAME)


async def tenant_member(request: web.Request) -> tuple[Principal, str]:
    """An operator, or a tenant principal of the URL's tenant."""
    principal = await authenticate(request)
    tenant_id = tenant_id_of(request)
    if principal.is_operator:
        return principal, tenant_id
    if principal.role != "tenant" or principal.tenant != tenant_id:
        raise Forbidden(f"this token is not allowed to access tenant {tenant_id!r}", tenant=tenant_id)
    return principal, tenant_id


async def tenant_resource(
    request: web.Request, resource: Resource, name: str | None, action: Action | None
) -> tuple[Principal, str]:
    """A tenant member whose grants allow ``action`` (any, when None) on the named resource
    (``name=None``: on some resource of that kind, e.g. to list or to create by body name)."""
    principal, tenant_id = await tenant_member(request)
    require_grant(principal, resource, name, action)
    return principal, tenant_id


async def named_resource(request: web.Request, resource: Resource, action: Action | None) -> tuple[str, str]:
    """The URL's tenant and ``{name}``, for a tenant member whose grants allow ``action`` (any,
    when None) on that ``resource``."""
    name = resource_name_of(request)
    _principal, tenant_id = await tenant_resource(request, resource, name, action)
    return tenant_id, name


def new_resource_name(principal: Principal, body: Body, resource: Resource) -> str:
    """The body's ``name`` of a topic or group to create, which the principal must administer."""
    name = body.name("name", RESOURCE_NAME, what=f"a name matching {RESOURCE_NAME.pattern}")
    require_grant(principal, resource, name, "admin")
    return name


def visible(principal: Principal, resource: Resource, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``items`` (topics or groups, by ``name``) the principal's grants cover: all for operators."""
    if principal.is_operator:
        return items
    return [i for i in items if allows(principal.grants, resource, i["name"], None)]


def require_grant(principal: Principal, resource: Resource, name: str | None, action: Action | None) -> None:
    if principal.is_operator:
        return
    ok = (
        allows(principal.grants, resource, name, action)
        if name is not None
        else any(g.resource == resource and (action is None or action in g.actions) for g in principal.grants)
    )
    if not ok:
        what = f"{resource} {name!r}" if name is not None else f"{resource}s"
        raise Forbidden(f"the credential's grants do not allow {action or 'access'} on {what}")


async def tenant_admin(request: web.Request) -> tuple[Principal, str]:
    principal, tenant_id = await tenant_member(request)
    if not principal.is_operator and not is_tenant_admin(principal.grants):
        raise Forbidden("managing credentials and ACLs needs admin on topic * and group *")
    return principal, tenant_id
