"""The reconciler's view of the control plane: ``Services`` as a ``StateSource``.

Turns a broker group's ``DesiredState`` into what the reconciler sends — topics and groups in
RocketMQ's terms, and the tenancy snapshot (credentials, tenant status, this group's quota
share, the group's HA link secret) for ORBIT_SYNC_TENANCY — and marks a topic active once its
broker group holds it.

The HA link secret of a group (docs/ha.md, "The HA link") is derived, not stored:
HMAC-SHA256(master key, "orbit-ha-link:" + group name). Every member of the group gets the same
one, another group another, and it changes only with the master key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Sequence

from control_plane.reconciler import BrokerTarget, DesiredBrokerState, tenancy_version
from control_plane.services import Services
from control_plane.settings import MasterKey

# The rates a broker enforces (its share); storage is watched by the control plane.
_RATES = ("publish_msgs_per_s", "publish_bytes_per_s", "consume_msgs_per_s", "consume_bytes_per_s")
_TOKEN_MARGIN_S = 60.0
HA_LINK_LABEL = b"orbit-ha-link:"


def ha_link_secret(master_key: MasterKey, group: str) -> bytes:
    """The HA link secret of broker group ``group`` (32 bytes)."""
    return hmac.new(master_key.value, HA_LINK_LABEL + group.encode(), hashlib.sha256).digest()


class ServicesStateSource:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._token = ""
        self._token_until = 0.0

    async def operator_token(self) -> str:
        """The control plane's own operator JWT, minted again shortly before it expires."""
        now = time.monotonic()
        if not self._token or now >= self._token_until:
            self._token = await self.services.mint_operator_token()
            self._token_until = now + self.services.settings.token_lifetime_s - _TOKEN_MARGIN_S
        return self._token

    async def broker_targets(self) -> list[BrokerTarget]:
        groups = await self.services.fleet.list_groups()
        return [
            BrokerTarget(g["name"], tuple(g["broker_addrs"]), tuple(g.get("namesrv_addrs") or ()))
            for g in groups
            if g.get("broker_addrs")
        ]

    async def desired_state(self, group: str) -> DesiredBrokerState:
        ds = await self.services.desired_state(group)
        return {
            "topics": [
                {
                    "name": t["name"],
                    "read_queue_nums": t["read_queue_nums"],
                    "write_queue_nums": t["write_queue_nums"],
                    "perm": t["perm"],
                    "order": t["order"],
                }
                for t in ds["topics"]
            ],
            "groups": [
                {"name": g["name"], "retry_max_times": g["retry_max_times"], "consume_orderly": g["consume_orderly"]}
                for g in ds["groups"]
            ],
            "tenancy": {
                "version": tenancy_version(),
                # None: unlimited. Local retention only for the topics that set one.
                "topic_retention_hours": {t["name"]: t["retention_hours"] for t in ds["topics"]},
                "topic_local_retention_hours": {
                    t["name"]: hours for t in ds["topics"] if (hours := t["local_retention_hours"]) is not None
                },
                "credentials": list(ds["credentials"]),
                "tenants": [
                    {
                        "id": t["id"],
                        "status": t["status"],
                        "limits": {k: t["quota"][k] for k in _RATES},  # type: ignore[literal-required]
                        "storage_bytes": t["quota"]["storage_bytes"],
                        "max_tiered_bytes": t["quota"]["max_tiered_bytes"],
                        "max_connections": t["quota"]["max_connections"],
                        "max_inflight_requests": t["quota"]["max_inflight_requests"],
                    }
                    for t in ds["tenants"]
                ],
                "ha_secret": base64.b64encode(ha_link_secret(self.services.settings.master_key, group)).decode(),
            },
        }

    async def topics_applied(self, group: str, names: Sequence[str]) -> None:
        ds = await self.services.desired_state(group)
        applied = set(names)
        for t in ds["topics"]:
            if t["status"] != "active" and t["name"] in applied:
                await self.services.mark_topic_active(tenant_id=t["tenant"], name=t["topic"], broker_group=group)
