"""Grants: what a credential may do inside its tenant's namespace.

    {"resource": "topic" | "group", "pattern": "orders" | "orders-*" | "*", "actions": [...]}

Patterns name resources inside the namespace (no tenant prefix, never a ``%``); a trailing ``*``
matches any suffix. Actions are "publish", "subscribe" and "admin".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast

from control_plane.errors import InvalidField

Resource = Literal["topic", "group"]
Action = Literal["publish", "subscribe", "admin"]
RESOURCES: tuple[Resource, ...] = ("topic", "group")
ACTIONS: tuple[Action, ...] = ("publish", "subscribe", "admin")
PATTERN = re.compile(r"^(\*|[A-Za-z0-9_-]{1,64}\*?)$")
MAX_GRANTS = 64


class GrantDict(TypedDict):
    resource: Resource
    pattern: str
    actions: list[Action]


@dataclass(frozen=True, slots=True)
class Grant:
    resource: Resource
    pattern: str
    actions: frozenset[Action]

    def matches(self, resource: Resource, name: str) -> bool:
        if resource != self.resource:
            return False
        if self.pattern.endswith("*"):
            return name.startswith(self.pattern[:-1])
        return name == self.pattern

    def to_dict(self) -> GrantDict:
        return {"resource": self.resource, "pattern": self.pattern, "actions": sorted(self.actions)}


def default_grants() -> list[Grant]:
    """Full access inside the tenant's own namespace."""
    return [
        Grant("topic", "*", frozenset({"publish", "subscribe", "admin"})),
        Grant("group", "*", frozenset({"subscribe", "admin"})),
    ]


def parse_grants(value: Any, *, field: str = "grants") -> list[Grant]:
    if not isinstance(value, list):
        raise InvalidField(field, "must be a list of grants")
    if len(value) > MAX_GRANTS:
        raise InvalidField(field, f"at most {MAX_GRANTS} grants")
    grants = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict) or set(item) != {"resource", "pattern", "actions"}:
            raise InvalidField(where, "must be an object with resource, pattern and actions")
        resource, pattern, actions = item["resource"], item["pattern"], item["actions"]
        if resource not in RESOURCES:
            raise InvalidField(f"{where}.resource", f"must be one of {', '.join(RESOURCES)}")
        if not isinstance(pattern, str) or not PATTERN.fullmatch(pattern):
            raise InvalidField(f"{where}.pattern", "must be a name, a prefix followed by *, or *")
        if (
            not isinstance(actions, list)
            or not actions
            or not all(isinstance(a, str) and a in ACTIONS for a in actions)
        ):
            raise InvalidField(f"{where}.actions", f"must be a non-empty list of {', '.join(ACTIONS)}")
        grants.append(Grant(cast(Resource, resource), pattern, frozenset(cast(list[Action], actions))))
    return grants


def grants_to_json(grants: Iterable[Grant]) -> list[GrantDict]:
    return [g.to_dict() for g in grants]


def grants_from_json(value: Sequence[Any]) -> list[Grant]:
    return [
        Grant(cast(Resource, g["resource"]), str(g["pattern"]), frozenset(cast(list[Action], g["actions"])))
        for g in value
    ]


def allows(grants: Iterable[Grant], resource: Resource, name: str, action: Action | None) -> bool:
    """Whether some grant allows ``action`` (any action when None) on ``resource`` ``name``."""
    return any(g.matches(resource, name) and (action is None or action in g.actions) for g in grants)


def is_tenant_admin(grants: Iterable[Grant]) -> bool:
    """Admin of the whole namespace: admin on every topic and every group (manages credentials,
    ACLs and everything else of the tenant)."""
    grants = list(grants)
    return all(any(g.resource == r and g.pattern == "*" and "admin" in g.actions for g in grants) for r in RESOURCES)
