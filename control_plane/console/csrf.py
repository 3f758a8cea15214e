"""CSRF tokens: every state-changing form carries ``csrf``, an HMAC of what the browser's
cookies bind the page to — the session token when signed in, else a random nonce cookie (the
sign-in form) — under a key derived from the master key. A POST whose field does not match is
refused 403 before anything else is read or done. SameSite=Strict cookies already keep other
sites' forms from carrying the session; the token is the second, independent check."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from aiohttp import web

from control_plane.console import session
from control_plane.errors import Forbidden

FIELD = "csrf"
KEY = web.AppKey("console_csrf_key", bytes)
NONCE_REQUEST_KEY = web.RequestKey("console_new_nonce", str)  # a nonce made for this answer


def derive_key(master_key: bytes) -> bytes:
    return hmac.new(master_key, b"orbit console csrf", hashlib.sha256).digest()


def _basis(request: web.Request) -> str | None:
    return session.token_of(request) or request.cookies.get(session.NONCE_COOKIE) or None


def token_for(request: web.Request) -> str:
    """The page's CSRF token; without a session or nonce, a new nonce (``set_new_nonce`` sends it)."""
    basis = _basis(request)
    if basis is None:
        basis = secrets.token_urlsafe(24)
        request[NONCE_REQUEST_KEY] = basis
    return hmac.new(request.app[KEY], basis.encode(), hashlib.sha256).hexdigest()


def set_new_nonce(request: web.Request, response: web.StreamResponse) -> None:
    """Put the nonce ``token_for`` made (if it made one) into its cookie."""
    nonce = request.get(NONCE_REQUEST_KEY)
    if nonce is not None:
        response.set_cookie(session.NONCE_COOKIE, nonce, **session.cookie_flags(request))  # type: ignore[arg-type]


def check(request: web.Request, submitted: str | None) -> None:
    basis = _basis(request)
    if basis is None or not submitted:
        raise Forbidden("this form has no valid CSRF token: reload the page and send it again")
    expected = hmac.new(request.app[KEY], basis.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, submitted):
        raise Forbidden("this form has no valid CSRF token: reload the page and send it again")
