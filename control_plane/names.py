"""Names shared with the data plane and the SDK: tenant ids, topic and group names, and their
RocketMQ wire form (``tenant%name``, ``%RETRY%tenant%group``, ``%DLQ%tenant%group``)."""

from __future__ import annotations

import re

TENANT_ID = re.compile(r"^[a-z][a-z0-9-]{1,30}[a-z0-9]$")
RESOURCE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PLAN_NAME = TENANT_ID
BROKER_GROUP_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NAMESPACE_SEPARATOR = "%"
OPERATOR_TENANT = "*"  # the ``tenant`` claim of operator and broker tokens


def is_tenant_id(value: str) -> bool:
    return TENANT_ID.fullmatch(value) is not None


def is_resource_name(value: str) -> bool:
    return RESOURCE_NAME.fullmatch(value) is not None


def wire_name(tenant_id: str, name: str) -> str:
    return f"{tenant_id}{NAMESPACE_SEPARATOR}{name}"


def retry_topic(tenant_id: str, group: str) -> str:
    return f"%RETRY%{wire_name(tenant_id, group)}"


def dlq_topic(tenant_id: str, group: str) -> str:
    return f"%DLQ%{wire_name(tenant_id, group)}"
