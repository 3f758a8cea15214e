"""Tenancy on the broker: per-tenant quotas (``quota``), usage metering (``metering``), the
durable usage spool (``usage_spool``) and its reporter to the control plane (``usage_reporter``).
See docs/quotas_and_metering.md. ``namespace`` holds the tenant-id and resource-name rules and
the wire form of names that the control plane, the authorizer and the broker share."""
