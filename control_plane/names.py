"""The control plane's name patterns: the shared tenant-id and resource-name rules of
``data_plane/tenancy/namespace.py`` (which also holds the wire form: ``wire_name``,
``retry_topic``, ``dlq_topic``), anchored for request validation and the OpenAPI schemas, plus
the names only the control plane has (plans, broker groups)."""

from __future__ import annotations

import re

from data_plane.tenancy.namespace import ANY_TENANT, NAME_PATTERN, TENANT_PATTERN

TENANT_ID = re.compile(f"^{TENANT_PATTERN}$")
RESOURCE_NAME = re.compile(f"^{NAME_PATTERN}$")
PLAN_NAME = TENANT_ID
BROKER_GROUP_NAME = RESOURCE_NAME
OPERATOR_TENANT = ANY_TENANT  # the ``tenant`` claim of operator and broker tokens
