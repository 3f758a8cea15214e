"""The one error middleware: every domain error, every aiohttp HTTP error and every bug leaves
as the same JSON shape, ``{"error": {"code", "message", "details"}}``. Bugs are logged with
their traceback and answered 500 ``internal_error`` without internals."""

from __future__ import annotations

import logging

from aiohttp import web

from control_plane.errors import ControlPlaneError
from control_plane.routes import Handler, json_response

log = logging.getLogger(__name__)

HTTP_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_body(code: str, message: str, **details: object) -> dict[str, object]:
    return {"error": {"code": code, "message": message, "details": details}}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ControlPlaneError as e:
        headers = {"WWW-Authenticate": 'Bearer realm="orbit"'} if e.status == 401 else None
        return json_response(e.body(), status=e.status, headers=headers)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = HTTP_CODES.get(e.status, "http_error")
        message = e.reason if e.status != 404 else f"no route {request.method} {request.path}"
        return json_response(error_body(code, message), status=e.status)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.rel_url.path)
        return json_response(error_body("internal_error", "internal error"), status=500)
