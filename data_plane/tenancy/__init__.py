"""Tenancy on the broker: per-tenant quotas (``quota``), usage metering (``metering``), the
durable usage spool (``usage_spool``) and its reporter to the control plane (``usage_reporter``).
See docs/quotas_and_metering.md."""
