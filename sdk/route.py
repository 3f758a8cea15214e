"""A topic's route as the name server answers GET_ROUTEINFO_BY_TOPIC, turned into queues.

``TopicRouteData`` (wire JSON, ``data_plane.remoting.bodies``) lists, per broker name, how
many read and write queues the topic has there and the permission bits, and per broker name
its addresses by broker id ("0" = the master). From it:

* publish queues — queue ids ``0..writeQueueNums-1`` of every broker whose perm has WRITE (2)
  and that has a master;
* subscribe queues — ``0..readQueueNums-1`` of every broker whose perm has READ (4).

A broker refusing a send to one of a route's queues trims the cached route until the name
servers' next answer (``without_write_queues``): a topic's queue ids on a broker are
``0..n-1``, so a refused id and every id above it are not writable there.

Both are sorted (topic, broker name, queue id), so every client in every process sees the same
order: a sharding key picks the same queue everywhere, and allocation is the same on each
consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from data_plane.remoting.codes import PERM_READ, PERM_WRITE
from sdk.message import MessageQueue

MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    publish_queues: tuple[MessageQueue, ...]
    subscribe_queues: tuple[MessageQueue, ...]
    broker_addrs: dict[str, dict[int, str]] = field(default_factory=dict)  # name → id → "host:port"
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    def master_addr(self, broker_name: str) -> str | None:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def brokers(self) -> list[str]:
        return sorted(self.broker_addrs)


def parse_route(topic: str, data: dict[str, Any], *, max_write_queues: int | None = None) -> TopicRoute:
    """The route of ``topic`` from TopicRouteData. ``max_write_queues`` caps each broker's write
    queues (used when borrowing the default topic's route to auto-create a topic)."""
    addrs: dict[str, dict[int, str]] = {}
    for bd in data.get("brokerDatas") or []:
        by_id: dict[int, str] = {}
        for bid, addr in (bd.get("brokerAddrs") or {}).items():
            try:
                by_id[int(bid)] = str(addr)
            except (TypeError, ValueError):
                continue
        addrs[str(bd["brokerName"])] = by_id
    publish: list[MessageQueue] = []
    subscribe: list[MessageQueue] = []
    for qd in data.get("queueDatas") or []:
        name = str(qd["brokerName"])
        perm = int(qd.get("perm", 0))
        if perm & PERM_WRITE and MASTER_ID in addrs.get(name, {}):
            n = int(qd.get("writeQueueNums", 0))
            if max_write_queues is not None:
                n = min(n, max_write_queues)
            publish.extend(MessageQueue(topic, name, i) for i in range(n))
        if perm & PERM_READ:
            subscribe.extend(MessageQueue(topic, name, i) for i in range(int(qd.get("readQueueNums", 0))))
    return TopicRoute(topic, tuple(sorted(set(publish))), tuple(sorted(set(subscribe))), addrs, data)


def without_write_queues(route: TopicRoute, broker_name: str, from_queue_id: int = 0) -> TopicRoute:
    """``route`` without the publish queues of ``broker_name`` from ``from_queue_id`` up (0:
    all of that broker's); ``route`` itself when it has none of them."""
    kept = tuple(q for q in route.publish_queues if q.broker_name != broker_name or q.queue_id < from_queue_id)
    return route if len(kept) == len(route.publish_queues) else replace(route, publish_queues=kept)
