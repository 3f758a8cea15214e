"""ForcedDeletions: what the store deleted inside retention at the emergency watermark, per tenant.

    store.clean_once ─▶ ForcedDeletion (one CommitLog file: messages inside retention per topic)
                    ─▶ ForcedDeletions(...) ─▶ one warning per tenant in the log
                                            ─▶ counters: runtime info (GET_BROKER_RUNTIME_INFO, 28)
                                               ``forcedDeletionFiles``, ``forcedDeletionMessages``,
                                               ``forcedDeletionMessages.<tenant>``; OpenTelemetry
                                               ``orbit.store.forced_deletion.messages``
                                            ─▶ UsageMeter.record_forced_deletion ─▶ the usage
                                               record's ``forced_deleted_messages`` (control plane)

A message's tenant is its queue's topic's namespace (``tenant%name``, ``%RETRY%tenant%group``,
``%DLQ%tenant%group``); messages of topics outside every namespace (system topics: delayed
messages not yet due, transaction halves, ...) count under ``SYSTEM``, which is logged and
exposed but not reported to the control plane. Counters cover this process's life.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from data_plane.store.retention import ForcedDeletion
from data_plane.tenancy.namespace import tenant_of

log = logging.getLogger(__name__)

SYSTEM = "-"  # the "tenant" of topics outside every namespace


class ForcedDeletions:
    __slots__ = ("files", "messages", "report")

    def __init__(self, report: Callable[[str, int], object] | None = None) -> None:
        """``report(tenant, messages)`` is told each tenant's share of every forced deletion
        (the usage meter's ``record_forced_deletion``)."""
        self.files = 0
        self.messages: dict[str, int] = {}  # tenant (or SYSTEM) -> messages deleted inside retention
        self.report = report

    def __call__(self, deletion: ForcedDeletion) -> None:
        per_tenant: dict[str, int] = {}
        for topic, n in deletion.messages_in_retention.items():
            tenant = tenant_of(topic) or SYSTEM
            per_tenant[tenant] = per_tenant.get(tenant, 0) + n
        self.files += 1
        usage = deletion.disk_usage_ratio * 100
        if not per_tenant:
            log.warning("forced deletion of CommitLog file %s at %.1f%% disk use: no queued message inside its "
                        "retention", deletion.file_name, usage)  # fmt: skip
        for tenant, n in sorted(per_tenant.items()):
            self.messages[tenant] = self.messages.get(tenant, 0) + n
            log.warning(
                "forced deletion of CommitLog file %s at %.1f%% disk use: tenant %s lost %d messages inside their "
                "retention (%d so far)", deletion.file_name, usage, tenant, n, self.messages[tenant],
            )  # fmt: skip
            if self.report is not None and tenant != SYSTEM:
                self.report(tenant, n)

    def runtime_info(self) -> dict[str, int]:
        info = {
            "forcedDeletionFiles": self.files,
            "forcedDeletionMessages": sum(self.messages.values()),
        }
        info.update({f"forcedDeletionMessages.{t}": n for t, n in sorted(self.messages.items())})
        return info
