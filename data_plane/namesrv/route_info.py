"""RouteInfoManager: the name server's whole state, rebuilt from broker registrations.

Tables (RocketMQ 4.x ``RouteInfoManager``)::

    broker table   broker name → BrokerData {cluster, brokerName, brokerAddrs {id → "host:port"}}
    cluster table  cluster name → {broker names}
    topic table    topic → {broker name → QueueData}      (what GET_ROUTEINFO_BY_TOPIC answers)
    live table     broker addr → last update time, data version, HA addr, connection id

Rules:

* Only a master (id 0) writes the topic table, and only on its first registration under that id
  or when its data version changed; a slave's registration never touches it.
* One address holds one id: a slave promoted to master (same address, id 0) leaves its old id.
  An address that registers under another broker name leaves its old name first.
* A slave's registration answers the master's address and HA address once the master is live.
* A broker goes when it unregisters, when the connection it registered over closes, or when it
  has not registered for longer than the expiry (120 s). When a broker name's last address goes,
  the name, its cluster membership and its queue data go with it; while a slave remains, the
  queue data stays (clients read from the slave and skip the master-less name when sending).
* Every address in the broker table has a live entry, so eviction by address is O(1); a reverse
  index (broker name → topics) makes removing a broker name independent of the topic count.
* At most ``max_brokers`` addresses and ``max_topics`` topics; past that a registration is
  refused whole with ``RouteLimitError`` (nothing of it applied).

Pure state: no sockets, no tasks; the clock is injected (seconds, monotonic).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypedDict

from data_plane.remoting.bodies import BrokerData, QueueData, TopicConfig, TopicRouteData

log = logging.getLogger(__name__)

MASTER_ID = 0
BROKER_EXPIRY_S = 120.0  # RocketMQ's BROKER_CHANNEL_EXPIRED_TIME
MAX_BROKERS = 10_000
MAX_TOPICS = 1_000_000

DataVersion = tuple[int, int]  # (timestamp, counter): equal versions mean unchanged topic configs


class ClusterInfo(TypedDict):
    brokerAddrTable: dict[str, BrokerData]
    clusterAddrTable: dict[str, list[str]]


class RouteLimitError(Exception):
    """A registration that would take the name server past one of its limits."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"the name server holds at most {limit:,} {what}; registration refused")
        self.what = what
        self.limit = limit


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """What a registration answers: for a slave whose master is live, the master's addresses."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


@dataclass(slots=True)
class BrokerLiveInfo:
    last_update_s: float
    data_version: DataVersion
    ha_server_addr: str
    conn_id: int | None
    broker_name: str
    broker_id: int


@dataclass(slots=True)
class _Broker:
    cluster: str
    name: str
    addrs: dict[int, str]

    def to_wire(self) -> BrokerData:
        return {
            "cluster": self.cluster,
            "brokerName": self.name,
            "brokerAddrs": {str(i): a for i, a in sorted(self.addrs.items())},
        }


class RouteInfoManager:
    def __init__(
        self,
        *,
        clock_s: Callable[[], float] = time.monotonic,
        max_brokers: int = MAX_BROKERS,
        max_topics: int = MAX_TOPICS,
    ) -> None:
        self.clock_s = clock_s
        self.max_brokers = max_brokers
        self.max_topics = max_topics
        self._brokers: dict[str, _Broker] = {}
        self._clusters: dict[str, set[str]] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._topics_by_broker: dict[str, set[str]] = {}
        self._live: dict[str, BrokerLiveInfo] = {}
        self._addrs_by_conn: dict[int, set[str]] = {}

    # --- sizes and lookups ----------------------------------------------------------------------
    @property
    def broker_count(self) -> int:
        return len(self._live)

    @property
    def topic_count(self) -> int:
        return len(self._topics)

    def live_info(self, broker_addr: str) -> BrokerLiveInfo | None:
        return self._live.get(broker_addr)

    def has_connection(self, conn_id: int) -> bool:
        """Whether a live broker registered over this connection."""
        return conn_id in self._addrs_by_conn

    # --- registration ---------------------------------------------------------------------------
    def register_broker(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topic_configs: Iterable[TopicConfig],
        data_version: DataVersion,
        conn_id: int | None = None,
    ) -> RegisterResult:
        configs = list(topic_configs)
        is_master = broker_id == MASTER_ID
        live = self._live.get(broker_addr)
        # Limits first, so a refused registration changes nothing.
        if live is None and len(self._live) >= self.max_brokers:
            raise RouteLimitError("brokers", self.max_brokers)
        if is_master:
            new_topics = {c["topicName"] for c in configs if c["topicName"] not in self._topics}
            if len(self._topics) + len(new_topics) > self.max_topics:
                raise RouteLimitError("topics", self.max_topics)

        if live is not None and live.broker_name != broker_name:
            log.info("broker %s moves from broker name %s to %s", broker_addr, live.broker_name, broker_name)
            self._remove_addr(broker_addr)
            live = None

        broker = self._brokers.get(broker_name)
        first = broker is None
        if broker is None:
            broker = self._brokers[broker_name] = _Broker(cluster, broker_name, {})
        elif broker.cluster != cluster:
            self._leave_cluster(broker.cluster, broker_name)
            broker.cluster = cluster
        self._clusters.setdefault(cluster, set()).add(broker_name)

        for bid in [i for i, a in broker.addrs.items() if a == broker_addr and i != broker_id]:
            del broker.addrs[bid]  # slave → master switch: one address, one id
        old_addr = broker.addrs.get(broker_id)
        if old_addr is not None and old_addr != broker_addr:
            log.warning("broker %s id %d: %s replaces %s", broker_name, broker_id, broker_addr, old_addr)
            self._forget_live(old_addr)
        broker.addrs[broker_id] = broker_addr
        first = first or old_addr is None

        if is_master and (first or live is None or live.data_version != data_version):
            for config in configs:
                self._update_queue_data(broker_name, config)

        if live is None:
            log.info("broker registered: %s %s id %d in cluster %s", broker_addr, broker_name, broker_id, cluster)
        elif live.conn_id != conn_id:
            self._unindex_conn(live.conn_id, broker_addr)
        self._live[broker_addr] = BrokerLiveInfo(
            self.clock_s(), data_version, ha_server_addr, conn_id, broker_name, broker_id
        )
        if conn_id is not None:
            self._addrs_by_conn.setdefault(conn_id, set()).add(broker_addr)

        if not is_master:
            master_addr = broker.addrs.get(MASTER_ID)
            master = self._live.get(master_addr) if master_addr is not None else None
            if master is not None:
                return RegisterResult(master_addr, master.ha_server_addr)
        return RegisterResult()

    def _update_queue_data(self, broker_name: str, config: TopicConfig) -> None:
        topic = config["topicName"]
        self._topics.setdefault(topic, {})[broker_name] = {
            "brokerName": broker_name,
            "readQueueNums": config["readQueueNums"],
            "writeQueueNums": config["writeQueueNums"],
            "perm": config["perm"],
            "topicSynFlag": config["topicSysFlag"],
        }
        self._topics_by_broker.setdefault(broker_name, set()).add(topic)

    # --- removal --------------------------------------------------------------------------------
    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Remove the broker at ``broker_addr`` if it is registered under that name and id (a late
        unregister of a replaced broker must not remove its successor). ``cluster`` is not checked."""
        live = self._live.get(broker_addr)
        if live is None or live.broker_name != broker_name or live.broker_id != broker_id:
            return False
        log.info("broker unregistered: %s %s id %d (cluster %s)", broker_addr, broker_name, broker_id, cluster)
        self._remove_addr(broker_addr)
        return True

    def on_connection_closed(self, conn_id: int) -> list[str]:
        """Remove every broker registered over the closed connection; returns their addresses."""
        addrs = sorted(self._addrs_by_conn.get(conn_id, ()))
        for addr in addrs:
            log.info("broker %s removed: its connection closed", addr)
            self._remove_addr(addr)
        return addrs

    def scan_not_active(self, expiry_s: float = BROKER_EXPIRY_S) -> list[tuple[str, int | None]]:
        """Evict brokers not heard from for more than ``expiry_s``; returns (addr, connection id)
        of each evicted broker."""
        now = self.clock_s()
        dead = [(a, i.conn_id) for a, i in self._live.items() if i.last_update_s + expiry_s < now]
        for addr, _ in dead:
            log.warning("broker %s evicted: no registration for more than %.1f s", addr, expiry_s)
            self._remove_addr(addr)
        return dead

    def delete_topic(self, topic: str) -> bool:
        queues = self._topics.pop(topic, None)
        if queues is None:
            return False
        for name in queues:
            topics = self._topics_by_broker.get(name)
            if topics is not None:
                topics.discard(topic)
        return True

    def _remove_addr(self, addr: str) -> None:
        info = self._forget_live(addr)
        if info is None:
            return
        broker = self._brokers.get(info.broker_name)
        if broker is None:
            return
        for bid in [i for i, a in broker.addrs.items() if a == addr]:
            del broker.addrs[bid]
        if not broker.addrs:
            self._remove_broker_name(broker)

    def _forget_live(self, addr: str) -> BrokerLiveInfo | None:
        info = self._live.pop(addr, None)
        if info is not None:
            self._unindex_conn(info.conn_id, addr)
        return info

    def _unindex_conn(self, conn_id: int | None, addr: str) -> None:
        if conn_id is None:
            return
        addrs = self._addrs_by_conn.get(conn_id)
        if addrs is not None:
            addrs.discard(addr)
            if not addrs:
                del self._addrs_by_conn[conn_id]

    def _remove_broker_name(self, broker: _Broker) -> None:
        log.info("broker name %s removed: no address left", broker.name)
        del self._brokers[broker.name]
        self._leave_cluster(broker.cluster, broker.name)
        for topic in self._topics_by_broker.pop(broker.name, ()):
            queues = self._topics.get(topic)
            if queues is not None:
                queues.pop(broker.name, None)
                if not queues:
                    del self._topics[topic]

    def _leave_cluster(self, cluster: str, broker_name: str) -> None:
        names = self._clusters.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._clusters[cluster]

    # --- answers --------------------------------------------------------------------------------
    def pick_route(self, topic: str) -> TopicRouteData | None:
        """The topic's queues and the brokers serving them; None when either is missing."""
        queues = self._topics.get(topic)
        if not queues:
            return None
        broker_datas = [b.to_wire() for name in queues if (b := self._brokers.get(name)) is not None]
        if not broker_datas:
            return None
        return {
            "queueDatas": [q.copy() for q in queues.values()],
            "brokerDatas": broker_datas,
            "filterServerTable": {},
        }

    def cluster_info(self) -> ClusterInfo:
        return {
            "brokerAddrTable": {name: b.to_wire() for name, b in self._brokers.items()},
            "clusterAddrTable": {c: sorted(names) for c, names in self._clusters.items()},
        }

    def all_topics(self) -> list[str]:
        return list(self._topics)
