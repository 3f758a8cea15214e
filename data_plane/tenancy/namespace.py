"""Orbit's names, the one home of their rules: tenant ids, resource (topic and group) names, and
their RocketMQ wire form (``tenant%name``). The control plane, the authorizer and the broker's
tenancy all import them from here.

    orders                    tenant None  (no namespace: a system or single-tenant resource)
    acme%orders               tenant "acme"
    %RETRY%acme%billing       tenant "acme"  (a group's retry topic: the prefix comes first)
    %DLQ%acme%billing         tenant "acme"  (its dead-letter topic)

* A tenant id matches ``TENANT_PATTERN`` (lower case, 3 to 32 characters); a topic or group name
  matches ``NAME_PATTERN`` (letters, digits, ``_`` and ``-``, 1 to 64). Operators and brokers
  have tenant ``ANY_TENANT`` (``"*"``).
* ``wire_name`` / ``retry_topic`` / ``dlq_topic`` build wire names.
* ``parse_wire_name`` splits one and checks both parts against the rules (the authorizer: names
  without a valid tenant prefix, e.g. ``TBW102``, belong to no tenant); it is on the hot path,
  so it is one precompiled regex match.
* ``tenant_of`` is the looser, faster split quotas and metering key their state by (the same
  rule as RocketMQ's ``NamespaceUtil``: any non-empty text before the first ``%``); it runs per
  request, so it is plain string operations.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

TENANT_PATTERN: Final = r"[a-z][a-z0-9-]{1,30}[a-z0-9]"
NAME_PATTERN: Final = r"[A-Za-z0-9_-]{1,64}"
TENANT_RE: Final = re.compile(TENANT_PATTERN)
NAME_RE: Final = re.compile(NAME_PATTERN)

SEPARATOR: Final = "%"
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
ANY_TENANT: Final = "*"  # the tenant of operators and brokers (the ``tenant`` claim of their tokens)

# "%RETRY%acme%g" / "%DLQ%acme%g" / "acme%orders": (special prefix, tenant, name).
_WIRE_RE: Final = re.compile(rf"(?:%(RETRY|DLQ)%)?({TENANT_PATTERN})%({NAME_PATTERN})")


def valid_tenant(tenant: str) -> bool:
    return TENANT_RE.fullmatch(tenant) is not None


def valid_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None


def wire_name(tenant: str, name: str) -> str:
    """``acme``, ``orders`` → ``acme%orders``."""
    return f"{tenant}{SEPARATOR}{name}"


def retry_topic(tenant: str, group: str) -> str:
    return f"{RETRY_PREFIX}{tenant}{SEPARATOR}{group}"


def dlq_topic(tenant: str, group: str) -> str:
    return f"{DLQ_PREFIX}{tenant}{SEPARATOR}{group}"


class WireName(NamedTuple):
    """A wire name split: ``special`` is ``""``, ``"RETRY"`` or ``"DLQ"``; ``tenant`` is ``None``
    for a name outside every tenant's namespace (then ``name`` is the whole wire name)."""

    special: str
    tenant: str | None
    name: str


def parse_wire_name(wire: str) -> WireName:
    m = _WIRE_RE.fullmatch(wire)
    if m is None:
        return WireName("", None, wire)
    return WireName(m.group(1) or "", m.group(2), m.group(3))


def tenant_of(resource: str) -> str | None:
    """The namespace of ``resource``, or None when it has none."""
    if resource.startswith(SEPARATOR):
        if resource.startswith(RETRY_PREFIX):
            resource = resource[len(RETRY_PREFIX) :]
        elif resource.startswith(DLQ_PREFIX):
            resource = resource[len(DLQ_PREFIX) :]
        else:
            return None
    tenant, sep, name = resource.partition(SEPARATOR)
    if not sep or not tenant or not name:
        return None
    return tenant
