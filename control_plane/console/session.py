"""The console's session: the JWT the token endpoint would issue for the same client id and
secret, kept in a cookie the page's scripts cannot read.

    orbit_session = <JWT>; HttpOnly; SameSite=Strict; Path=/console/; Max-Age=<token lifetime>
                   (+ Secure when the control plane serves HTTPS)

The cookie lives as long as the token: once the token expires (or its credential is revoked, or
its tenant suspended) the API's checks refuse it and the console asks to sign in again. Signing
out clears the cookie. Only console routes read it (``auth.SESSION_TOKEN``); the API answers
Authorization headers alone, so no cross-site request can use the session there.
"""

from __future__ import annotations

from aiohttp import web

from control_plane import auth
from control_plane.errors import InvalidField

COOKIE = "orbit_session"
NONCE_COOKIE = "orbit_nonce"  # what the CSRF token of a page without a session is bound to
FLASH_COOKIE = "orbit_flash"  # one message for the next page (after a redirect)
PATH = "/console/"
MAX_FLASH_CHARS = 200


def cookie_flags(request: web.Request) -> dict[str, object]:
    return {"path": PATH, "httponly": True, "samesite": "Strict", "secure": request.secure}


def token_of(request: web.Request) -> str | None:
    """The session cookie's token, when it has a token's shape (None: no session)."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        auth.check_token_shape(COOKIE, token)
    except InvalidField:
        return None
    return token


def start(request: web.Request, response: web.StreamResponse, token: str, lifetime_s: int) -> None:
    response.set_cookie(COOKIE, token, max_age=lifetime_s, **cookie_flags(request))  # type: ignore[arg-type]


def end(request: web.Request, response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path=PATH, secure=request.secure, httponly=True, samesite="Strict")


def flash(request: web.Request, response: web.StreamResponse, message: str) -> None:
    """Show ``message`` on the next page (no secret ever goes here)."""
    response.set_cookie(FLASH_COOKIE, message[:MAX_FLASH_CHARS], max_age=60, **cookie_flags(request))  # type: ignore[arg-type]


def take_flash(request: web.Request, response: web.StreamResponse) -> str | None:
    message = request.cookies.get(FLASH_COOKIE)
    if message:
        response.del_cookie(FLASH_COOKIE, path=PATH, secure=request.secure, httponly=True, samesite="Strict")
    return message or None
