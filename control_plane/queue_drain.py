"""Whether read-only queues are drained, asked of the brokers (``sdk.admin.AdminClient`` with
the control plane's own operator token, through the name servers of the fleet).

Queues ``[first, end)`` of a topic on a broker group are drained when every consumer group of
the tenant that consumes the topic (it has committed an offset on one of its queues) has
committed all of them — up to each queue's max offset; a queue that holds no message (its max
offset at its min) is drained whoever consumes it. When no group consumes the topic, the queues
must hold no message: retention empties them in time, and nothing is left behind meanwhile. Any
doubt — a broker not answering, the route not listing the queues — is "not drained yet"."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from control_plane.services import Services
from data_plane.tenancy.namespace import wire_name
from sdk.admin import AdminClient, AdminError, QueueProgress
from sdk.credentials import StaticToken

log = logging.getLogger(__name__)
TIMEOUT_MS = 5000
# A consumer group name no tenant can make ("~" is not in RESOURCE_NAME): what the queues hold
# is read through it when no group of the tenant consumes the topic.
PROBE_GROUP = "orbit~drain-probe"


class BrokerDrainCheck:
    def __init__(self, services: Services, token: Callable[[], Awaitable[str]]) -> None:
        self.services = services
        self.token = token

    async def drained(self, tenant: str, topic: str, group: str, first: int, end: int) -> bool:
        fleet = await self.services.fleet.list_groups()
        addrs = sorted({a for g in fleet for a in g["namesrv_addrs"]})
        if not addrs:
            return False
        consumer_groups = [g["name"] for g in await self.services.groups.list_groups(tenant_id=tenant)]
        client = AdminClient(addrs, timeout_ms=TIMEOUT_MS, credentials=StaticToken(await self.token()))
        try:
            consuming = False
            for name in consumer_groups:
                rows = await client.group_progress(wire_name(tenant, name), wire_name(tenant, topic))
                if all(r.consumer_offset < 0 for r in rows):
                    continue  # the group does not consume this topic
                consuming = True
                if not _all_consumed(_of(rows, group, first, end), first, end):
                    return False
            if consuming:
                return True
            rows = await client.group_progress(wire_name(tenant, PROBE_GROUP), wire_name(tenant, topic))
            mine = _of(rows, group, first, end)
            return len(mine) == end - first and all(r.broker_offset <= r.min_offset for r in mine)
        except AdminError as e:
            log.info("drain check of %s%%%s on %s: %s", tenant, topic, group, e)
            return False
        finally:
            await client.close()


def _of(rows: list[QueueProgress], group: str, first: int, end: int) -> list[QueueProgress]:
    return [r for r in rows if r.broker_name == group and first <= r.queue_id < end]


def _all_consumed(mine: list[QueueProgress], first: int, end: int) -> bool:
    if len(mine) != end - first:
        return False  # the route does not list every queue: not known
    return all(r.broker_offset <= r.min_offset or r.consumer_offset >= r.broker_offset for r in mine)
