"""Domain errors of the control plane, one root (``ControlPlaneError``).

Each class carries a stable ``code`` (the ``error.code`` of the JSON answer) and the HTTP
``status`` it maps to; ``details`` holds data as attributes rather than prose. The single error
middleware (``control_plane.middleware``) turns any of them into

    {"error": {"code": "topic_not_found", "message": "...", "details": {...}}}

``CODES`` is built from the subclasses, so a code and its class never drift apart.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ControlPlaneError(Exception):
    """Root of every domain error."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


# --- 400: the request itself is wrong -------------------------------------------------------
class InvalidRequest(ControlPlaneError):
    code = "invalid_request"
    status = 400


class MalformedJson(InvalidRequest):
    code = "malformed_json"


class InvalidField(InvalidRequest):
    """One field of the body, the query string, the path or a header is missing or of the wrong shape."""

    code = "invalid_field"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field {field!r}: {reason}", field=field, reason=reason)
        self.field = field
        self.reason = reason


class PayloadTooLarge(ControlPlaneError):
    code = "payload_too_large"
    status = 413

    def __init__(self, size_bytes: int | None, limit_bytes: int) -> None:
        shown = "more than" if size_bytes is None else f"{size_bytes} bytes,"
        super().__init__(
            f"request body is {shown} the limit of {limit_bytes} bytes",
            limit_bytes=limit_bytes,
        )
        self.limit_bytes = limit_bytes


# --- 401 / 403: who is asking, and may they ---------------------------------------------------
class Unauthenticated(ControlPlaneError):
    code = "unauthenticated"
    status = 401


class InvalidToken(Unauthenticated):
    code = "invalid_token"


class Forbidden(ControlPlaneError):
    code = "forbidden"
    status = 403


class TenantSuspended(Forbidden):
    code = "tenant_suspended"


# --- 404 -------------------------------------------------------------------------------------
class NotFound(ControlPlaneError):
    code = "not_found"
    status = 404


class TenantNotFound(NotFound):
    code = "tenant_not_found"


class PlanNotFound(NotFound):
    code = "plan_not_found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class GroupNotFound(NotFound):
    code = "group_not_found"


class CredentialNotFound(NotFound):
    code = "credential_not_found"


class BrokerGroupNotFound(NotFound):
    code = "broker_group_not_found"


class BrokerHostNotFound(NotFound):
    """The host is not the host part of any of the broker group's ``broker_addrs``."""

    code = "broker_host_not_found"


# --- 409 / 422: state says no ------------------------------------------------------------------
class Conflict(ControlPlaneError):
    code = "conflict"
    status = 409


class MemberRunsElsewhere(Conflict):
    code = "member_runs_elsewhere"


class TenantExists(Conflict):
    code = "tenant_exists"


class BrokerGroupExists(Conflict):
    code = "broker_group_exists"


class BrokerGroupInUse(Conflict):
    """Topics still have queues placed on the broker group (``placed_queues``)."""

    code = "broker_group_in_use"


class TopicExists(Conflict):
    """A topic of that name exists with another spec (the same spec is not an error)."""

    code = "topic_exists"


class GroupExists(Conflict):
    code = "group_exists"


class QuotaExceeded(ControlPlaneError):
    """A plan limit (or its override) would be exceeded; ``details.limit`` names it, ``allowed``
    is its value and ``requested`` what the request needs (numbers, or booleans for a flag such
    as ``unlimited_retention``)."""

    code = "quota_exceeded"
    status = 422

    def __init__(self, limit: str, *, allowed: int | bool, requested: int | bool, message: str = "") -> None:
        super().__init__(
            message or f"plan limit {limit} is {allowed}; this request needs {requested}",
            limit=limit,
            allowed=allowed,
            requested=requested,
        )
        self.limit = limit
        self.allowed = allowed
        self.requested = requested


class InsufficientCapacity(ControlPlaneError):
    """The broker fleet has no room for the queues asked for."""

    code = "insufficient_capacity"
    status = 503


class MigrationError(ControlPlaneError):
    """An applied migration's file changed, or a migration failed."""

    code = "migration_error"


def _all_subclasses(cls: type[ControlPlaneError]) -> list[type[ControlPlaneError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


CODES: dict[str, type[ControlPlaneError]] = {c.code: c for c in _all_subclasses(ControlPlaneError)}
