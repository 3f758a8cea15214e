"""Which tenant a wire resource belongs to: RocketMQ's namespace form ``tenant%name``.

    orders                    None      (no namespace: a system or single-tenant resource)
    acme%orders               "acme"
    %RETRY%acme%billing       "acme"    (a group's retry topic: the prefix comes first)
    %DLQ%acme%billing         "acme"

The same rule as RocketMQ's ``NamespaceUtil``; quotas and metering key their state by this.
"""

from __future__ import annotations

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SEPARATOR = "%"


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
