"""The OpenAPI 3.1 document, built from the same ``Route`` list the app registers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from control_plane.errors import CODES
from control_plane.routes import Route

PATH_PARAM = re.compile(r"\{([^}]+)\}")
SECURITY: dict[str, list[dict[str, list[str]]]] = {
    "none": [],
    "client": [{"clientBasic": []}, {}],
    "operator": [{"bearer": []}],
    "tenant": [{"bearer": []}],
    "broker": [{"bearer": []}],
}
ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "enum": sorted(CODES)},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
            "required": ["code", "message", "details"],
        }
    },
    "required": ["error"],
}


def _operation(route: Route) -> dict[str, Any]:
    params = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in PATH_PARAM.findall(route.path)
    ]
    params += [{"name": q, "in": "query", "required": False, "schema": {"type": "string"}} for q in route.query]
    responses: dict[str, Any] = {}
    for status, text in sorted(route.responses.items()):
        responses[str(status)] = {"description": text}
        if status >= 400:
            responses[str(status)]["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    if route.auth in ("operator", "tenant", "broker"):
        responses.setdefault("401", {"description": "unauthenticated or invalid_token"})
        responses.setdefault("403", {"description": "forbidden"})
    if route.request_schema is not None:
        responses.setdefault("400", {"description": "malformed_json, invalid_request or invalid_field"})
        responses.setdefault("413", {"description": "payload_too_large"})
    if route.auth in ("operator", "tenant", "broker"):
        responses.setdefault("400", {"description": "invalid_field: a malformed Authorization header or parameter"})
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.handler.__name__,
        "tags": [route.tag],
        "security": SECURITY[route.auth],
        "responses": responses,
        "x-orbit-role": route.auth,
    }
    if params:
        op["parameters"] = params
    if route.request_schema is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": route.request_schema}}}
    return op


def build_document(routes: Sequence[Route], *, version: str = "0.1.0") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Orbit control plane",
            "version": version,
            "description": "Tenants, plans, fleet, topics, consumer groups, credentials, tokens and usage.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                "clientBasic": {"type": "http", "scheme": "basic"},
            },
        },
    }
