"""Principal and Grant: who is asking, and what they were granted.

A principal is the identity behind a request, built once per credential (a verified JWT, or an
access key of the credential store) and reused for every request that carries it::

    Principal(subject="ak-1", tenant="acme", role="tenant",
              grants=(Grant("topic", "orders-*", {"publish"}), Grant("group", "*", {"subscribe"})))

* ``role`` — ``tenant`` (confined to its own namespace and its grants), ``operator`` (anything)
  or ``broker`` (brokers and control-plane internals: anything). Operators and brokers have
  tenant ``"*"``.
* A grant names a resource kind (``topic`` | ``group``), a pattern inside the tenant's namespace
  (``"orders"``, ``"orders-*"`` or ``"*"``, never with the tenant prefix) and actions
  (``publish`` | ``subscribe`` | ``admin``). Actions are independent: ``admin`` does not imply
  ``publish``.

The tenant-id and name rules and the wire form of names (``"{tenant}%{name}"``, ``%RETRY%…``,
``%DLQ%…``, ``parse_wire_name``) live in ``data_plane/tenancy/namespace.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, TypedDict, cast

from data_plane.tenancy.namespace import ANY_TENANT, TENANT_RE, valid_tenant

Role = Literal["tenant", "operator", "broker"]
Action = Literal["publish", "subscribe", "admin"]
ResourceKind = Literal["topic", "group"]

ROLES: Final[frozenset[str]] = frozenset(("tenant", "operator", "broker"))
ACTIONS: Final[frozenset[str]] = frozenset(("publish", "subscribe", "admin"))
RESOURCE_KINDS: Final[frozenset[str]] = frozenset(("topic", "group"))
_PATTERN_RE: Final = re.compile(r"\*|[A-Za-z0-9_-]{1,64}|[A-Za-z0-9_-]{0,63}\*")


class AuthConfigError(ValueError):
    """A grant, principal or credential that cannot be used; the message says which and why."""


class GrantDict(TypedDict):
    """A grant as JSON (JWT ``grants`` claim, credential store snapshot, control-plane API)."""

    resource: str
    pattern: str
    actions: list[str]


class Grant:
    """Permission to do ``actions`` on the ``resource`` kind's names matching ``pattern``."""

    __slots__ = ("_exact", "_prefix", "actions", "pattern", "resource")

    def __init__(self, resource: str, pattern: str, actions: Iterable[str]) -> None:
        if resource not in RESOURCE_KINDS:
            raise AuthConfigError(f"grant resource {resource!r} is not one of {sorted(RESOURCE_KINDS)}")
        if not isinstance(pattern, str) or _PATTERN_RE.fullmatch(pattern) is None:
            raise AuthConfigError(
                f"grant pattern {pattern!r} is not a name, a prefix ending in '*', or '*' "
                "(patterns are inside the tenant's namespace, without the tenant prefix)"
            )
        acts = frozenset(actions)
        if not acts or not acts <= ACTIONS:
            raise AuthConfigError(f"grant actions {sorted(acts)} must be a non-empty subset of {sorted(ACTIONS)}")
        self.resource = resource
        self.pattern = pattern
        self.actions = acts
        self._prefix = pattern[:-1] if pattern.endswith("*") else None
        self._exact = None if self._prefix is not None else pattern

    def matches(self, resource: str, name: str, action: str) -> bool:
        if resource != self.resource or action not in self.actions:
            return False
        if self._prefix is not None:
            return name.startswith(self._prefix)
        return name == self._exact

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Grant:
        if not isinstance(d, Mapping):
            raise AuthConfigError(f"a grant must be an object, not {type(d).__name__}")
        actions = d.get("actions")
        if not isinstance(actions, list | tuple) or not all(isinstance(a, str) for a in actions):
            raise AuthConfigError("grant actions must be a list of strings")
        return cls(str(d.get("resource")), d.get("pattern"), actions)  # type: ignore[arg-type]

    def to_dict(self) -> GrantDict:
        return {"resource": self.resource, "pattern": self.pattern, "actions": sorted(self.actions)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grant):
            return NotImplemented
        return (self.resource, self.pattern, self.actions) == (other.resource, other.pattern, other.actions)

    def __hash__(self) -> int:
        return hash((self.resource, self.pattern, self.actions))

    def __repr__(self) -> str:
        return f"Grant({self.resource!r}, {self.pattern!r}, {sorted(self.actions)!r})"


def parse_grants(raw: Any) -> tuple[Grant, ...]:
    if not isinstance(raw, list | tuple):
        raise AuthConfigError("grants must be a list")
    return tuple(Grant.from_dict(g) for g in raw)


class Principal:
    """Who a request comes from. Hashes and compares by identity: one object per credential
    (cached with the token or the access key), so the authorizer's decision cache keys on it
    cheaply. Build with ``Principal.build`` to validate."""

    __slots__ = ("grants", "role", "source", "subject", "tenant")

    def __init__(self, subject: str, tenant: str, role: Role, grants: tuple[Grant, ...], source: str) -> None:
        self.subject = subject
        self.tenant = tenant
        self.role: Role = role
        self.grants = grants
        self.source = source  # "jwt" | "access_key" | "disabled"

    @classmethod
    def build(cls, *, subject: str, tenant: str, role: str, grants: Iterable[Grant] = (), source: str) -> Principal:
        if not isinstance(subject, str) or not subject:
            raise AuthConfigError("subject must be a non-empty string")
        if role not in ROLES:
            raise AuthConfigError(f"role {role!r} is not one of {sorted(ROLES)}")
        if role == "tenant":
            if not isinstance(tenant, str) or not valid_tenant(tenant):
                raise AuthConfigError(f"tenant {tenant!r} does not match {TENANT_RE.pattern}")
        elif tenant != ANY_TENANT:
            raise AuthConfigError(f"a principal with role {role!r} must have tenant '*', not {tenant!r}")
        return cls(subject, tenant, cast(Role, role), tuple(grants), source)

    @property
    def is_privileged(self) -> bool:
        """Operators and brokers may do anything."""
        return self.role != "tenant"

    def allows(self, resource: str, name: str, action: str) -> bool:
        """Whether a grant covers ``action`` on ``name`` (inside the tenant's namespace)."""
        if self.role != "tenant":
            return True
        return any(g.matches(resource, name, action) for g in self.grants)

    def __repr__(self) -> str:
        return (
            f"Principal(subject={self.subject!r}, tenant={self.tenant!r}, role={self.role!r}, "
            f"grants={len(self.grants)})"
        )
