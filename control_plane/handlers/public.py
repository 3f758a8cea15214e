"""Unauthenticated endpoints: health, the OpenAPI document, JWKS, and the OAuth token endpoint
(client-credentials grant; errors in OAuth's own shape, RFC 6749 §5.2).

The token endpoint answers a malformed request 400 ``invalid_request`` naming the field: a
malformed Basic Authorization header, or a client id or secret that is too long or holds control
characters (PostgreSQL text cannot hold NUL); such a request counts as no failed login. Credentials
that are well-formed but wrong are 401 ``invalid_client``."""

from __future__ import annotations

import base64
from urllib.parse import parse_qsl

import orjson
from aiohttp import web

from control_plane import context
from control_plane.errors import InvalidField
from control_plane.request_body import check_text, read_bytes
from control_plane.routes import Route, json_response
from control_plane.services.credentials import InvalidClient

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
MAX_CLIENT_ID_CHARS = 64
MAX_CLIENT_SECRET_CHARS = 256


async def healthz(request: web.Request) -> web.StreamResponse:
    await context.services(request).pool.fetchval("SELECT 1")
    return json_response({"status": "ok"})


async def openapi(request: web.Request) -> web.StreamResponse:
    return json_response(request.app[context.OPENAPI])


async def jwks(request: web.Request) -> web.StreamResponse:
    keys = await context.services(request).tokens.jwks()
    return json_response(keys, headers={"Cache-Control": "max-age=60"})


def _oauth_error(error: str, description: str, status: int) -> web.Response:
    headers = dict(NO_STORE)
    if status == 401:
        headers["WWW-Authenticate"] = 'Basic realm="orbit"'
    return json_response({"error": error, "error_description": description}, status=status, headers=headers)


def _form(raw: bytes, content_type: str) -> dict[str, str] | None:
    if content_type == "application/json":
        try:
            value = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return None
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return None
        return {str(k): v for k, v in value.items()}
    try:
        return dict(parse_qsl(raw.decode(), keep_blank_values=True, strict_parsing=bool(raw)))
    except (UnicodeDecodeError, ValueError):
        return None


def _client_credentials(request: web.Request, form: dict[str, str]) -> tuple[str, str]:
    """The client id and secret, from HTTP Basic auth if given, else from the body; InvalidField
    when either is malformed."""
    client_id, client_secret = form.get("client_id", ""), form.get("client_secret", "")
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "basic":
        try:
            client_id, _, client_secret = base64.b64decode(value, validate=True).decode().partition(":")
        except ValueError:  # not ASCII, not base64 (binascii.Error) or not UTF-8 (UnicodeDecodeError)
            raise InvalidField("Authorization", "malformed Basic credentials") from None
    check_text("client_id", client_id, max_chars=MAX_CLIENT_ID_CHARS)
    check_text("client_secret", client_secret, max_chars=MAX_CLIENT_SECRET_CHARS)
    return client_id, client_secret


async def token(request: web.Request) -> web.StreamResponse:
    services = context.services(request)
    raw = await read_bytes(request, limit_bytes=services.settings.json_body_limit_bytes)
    form = _form(raw, request.content_type)
    if form is None:
        return _oauth_error("invalid_request", "the body must be form-encoded or a JSON object of strings", 400)
    if form.get("grant_type") != "client_credentials":
        return _oauth_error("unsupported_grant_type", "only grant_type=client_credentials is supported", 400)
    try:
        client_id, client_secret = _client_credentials(request, form)
    except InvalidField as e:
        return _oauth_error("invalid_request", e.message, 400)
    if not client_id or not client_secret:
        return _oauth_error("invalid_client", "client id and secret are required", 401)
    limiter = request.app[context.LOGIN_LIMITER]
    address = request.remote or ""
    wait_s = limiter.retry_after_s(address, client_id)
    if wait_s:  # answered before any secret is hashed
        return json_response(
            {"error": "too_many_requests", "error_description": f"too many failed logins; retry in {wait_s} s"},
            status=429,
            headers={**NO_STORE, "Retry-After": str(wait_s)},
        )
    try:
        access_token, expires_in = await services.credentials.login(client_id, client_secret)
    except InvalidClient as e:
        limiter.failed(address, client_id)
        return _oauth_error("invalid_client", e.message, 401)
    body = {"access_token": access_token, "token_type": "Bearer", "expires_in": expires_in}
    return json_response(body, headers=NO_STORE)


TOKEN_REQUEST = {
    "type": "object",
    "description": "application/x-www-form-urlencoded (or JSON); client id and secret here or in HTTP Basic auth",
    "properties": {
        "grant_type": {"type": "string", "enum": ["client_credentials"]},
        "client_id": {"type": "string", "maxLength": MAX_CLIENT_ID_CHARS},
        "client_secret": {"type": "string", "maxLength": MAX_CLIENT_SECRET_CHARS},
    },
    "required": ["grant_type"],
}

ROUTES = [
    Route("GET", "/healthz", healthz, "Liveness: the database answers", "none", "meta"),
    Route("GET", "/openapi.json", openapi, "This document", "none", "meta"),
    Route(
        "GET",
        "/.well-known/jwks.json",
        jwks,
        "Public keys verifying Orbit tokens (active and recently retired)",
        "none",
        "auth",
    ),
    Route(
        "POST",
        "/oauth/token",
        token,
        "Client-credentials grant: a short-lived JWT",
        "client",
        "auth",
        request_schema=TOKEN_REQUEST,
        responses={200: "token", 400: "invalid request", 401: "invalid_client", 429: "too many failed logins"},
    ),
]
