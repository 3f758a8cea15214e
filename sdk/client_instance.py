"""ClientInstance: what producers and consumers of one process share (RocketMQ's MQClientInstance).

One instance per (event loop, name servers, instance name, credentials hook) holds:

* the ``RemotingClient`` — one connection per server, and the dispatch of the requests a
  broker sends us (NOTIFY_CONSUMER_IDS_CHANGED → the group's consumer rebalances at once);
* the route cache: topic → ``TopicRoute``, filled on demand from the name servers and refreshed
  every ``route_refresh_interval_ms`` (default 30 s, RocketMQ's pollNameServerInterval) for
  every topic a member uses — and at once when a broker says the cached route is stale
  (``route_stale``: a queue it does not serve, a topic it has not or takes no writes for), at
  most once a topic per ``route_refresh_min_interval_ms`` (``sdk.route_refresh``). A refreshed
  route whose queues changed makes the topic's consumers rebalance at once;
* heartbeats: every ``heartbeat_interval_ms`` a HEART_BEAT with every producer group and
  consumer group (with subscriptions) goes to every broker of those routes, so brokers know who
  is in a group; UNREGISTER_CLIENT when a member leaves;
* ``credentials``: a hook called with every request, returning extFields to add — or a
  ``TokenProvider`` (wrapped by ``sdk.credentials``). A hook with ``ensure_fresh()`` (every
  credential of ``sdk.credentials``) is asked before each request; it answers None while its
  token is fresh, else an awaitable the request waits on. None by default.

Members register with ``add_producer`` / ``add_consumer``; ``acquire`` / ``release`` count users
so the last one closes the instance. Consumers of one group must be in different instances
(pass different ``instance_name`` values), as brokers tell group members apart by client id.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand, json_text
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import RemotingError
from data_plane.remoting.server import Processors
from data_plane.tasks import cancel_all
from data_plane.tls import client_context_from_env
from sdk import protocol
from sdk.aio import wait_event
from sdk.client_id import new_client_id
from sdk.credentials import TokenProvider, as_hook
from sdk.errors import (
    BrokerNotFoundError,
    ClientStateError,
    IllegalArgumentError,
    OrbitError,
    QueueNotServedError,
    RouteNotFoundError,
    from_remoting,
)
from sdk.message import DEFAULT_TOPIC, MessageQueue
from sdk.pacer import shared_pacer
from sdk.route import MASTER_ID, TopicRoute, parse_route, without_write_queues
from sdk.route_refresh import DEFAULT_MIN_INTERVAL_MS, RouteRefreshLimiter

log = logging.getLogger(__name__)

Credentials = Callable[[RemotingCommand], Mapping[str, str] | None]
EnsureFresh = Callable[[], Awaitable[None] | None]


class ProducerMember(Protocol):
    group: str

    def topics(self) -> Iterable[str]: ...


class ConsumerMember(Protocol):
    group: str

    def topics(self) -> Iterable[str]: ...

    def consumer_data(self) -> bodies.ConsumerData: ...

    def request_rebalance(self) -> None: ...


def _split_namesrv(namesrv_addrs: str | Sequence[str]) -> tuple[str, ...]:
    items = namesrv_addrs.split(";") if isinstance(namesrv_addrs, str) else list(namesrv_addrs)
    addrs = tuple(a.strip() for a in items if a and a.strip())
    if not addrs:
        raise IllegalArgumentError("namesrv_addrs is empty")
    for a in addrs:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise IllegalArgumentError(f"name server address {a!r} is not host:port")
    return addrs


class ClientInstance:
    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        *,
        instance_name: str = "DEFAULT",
        credentials: Credentials | TokenProvider | None = None,
        request_timeout_ms: int = 3000,
        route_refresh_interval_ms: int = 30000,
        route_refresh_min_interval_ms: int = DEFAULT_MIN_INTERVAL_MS,
        heartbeat_interval_ms: int = 30000,
        connect_timeout_ms: int = 3000,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: connect to name servers and brokers over TLS with this context (see
        ``data_plane.tls.client_context``: it verifies the servers' certificates); None: TLS when
        the environment asks for it (``ORBIT_TLS_CA=<CA file>``, or ``ORBIT_TLS=1`` for the
        system's trust store), else plain TCP."""
        self.namesrv_addrs = _split_namesrv(namesrv_addrs)
        self.instance_name = instance_name
        self.client_id = new_client_id()
        self.credentials: Credentials | None = as_hook(credentials)
        # Sends to brokers that said the tenant is over quota (sdk/pacer.py), shared by the
        # process's clients of this credential.
        who = getattr(credentials, "client_id", None) or getattr(credentials, "access_key", None)
        self.pacer = shared_pacer(who if isinstance(who, str) else None)
        self._ensure_fresh: EnsureFresh | None = getattr(self.credentials, "ensure_fresh", None)
        # A bearer token's fields while it can go as it is (sdk.credentials): the send path lays
        # them into its frames, as text made once a token (send_connection).
        self._fresh_fields: Callable[[], Mapping[str, str] | None] | None = getattr(
            self.credentials, "fresh_fields", None
        )
        self._auth_text: tuple[object, bytes] = (None, b"")
        self.request_timeout_ms = request_timeout_ms
        self.route_refresh_interval_ms = route_refresh_interval_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        processors = Processors()
        processors.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_consumer_ids_changed)
        processors.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction_state)
        self.tls = tls if tls is not None else client_context_from_env()
        self.remoting = RemotingClient(processors, connect_timeout_ms=connect_timeout_ms, ssl_context=self.tls)
        self.routes: dict[str, TopicRoute] = {}
        self._extra_brokers: dict[str, dict[int, str]] = {}  # brokers of borrowed (TBW102) routes
        self.producers: dict[str, ProducerMember] = {}
        self.consumers: dict[str, ConsumerMember] = {}
        self._namesrv_index = 0
        self._route_locks: dict[str, asyncio.Lock] = {}
        self.route_refresh = RouteRefreshLimiter(self.fetch_route, route_refresh_min_interval_ms / 1000)
        self._refs = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._wake_heartbeat = asyncio.Event()
        self._wake_route_loop = asyncio.Event()
        self.started = False
        self.closed = False
        self.on_close: Callable[[ClientInstance], None] | None = None

    # --- life cycle -----------------------------------------------------------------------------------
    async def acquire(self) -> None:
        if self.closed:
            raise ClientStateError("client instance is closed")
        self._refs += 1
        if not self.started:
            self.started = True
            self._tasks = [
                asyncio.create_task(self._route_loop(), name=f"orbit-route-{self.client_id}"),
                asyncio.create_task(self._heartbeat_loop(), name=f"orbit-heartbeat-{self.client_id}"),
            ]

    async def release(self) -> None:
        self._refs -= 1
        if self._refs <= 0:
            await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await cancel_all(self._tasks)
        await self.route_refresh.close()
        await self.remoting.close()
        if self.on_close is not None:
            self.on_close(self)

    # --- members ------------------------------------------------------------------------------------
    def shorten_route_refresh(self, interval_ms: int) -> None:
        """Refresh routes every ``interval_ms`` from now on, if that is more often than now (a
        member joining the shared instance with a shorter ``route_refresh_interval_ms``)."""
        if interval_ms < self.route_refresh_interval_ms:
            self.route_refresh_interval_ms = interval_ms
            self._wake_route_loop.set()

    def add_producer(self, member: ProducerMember) -> None:
        if member.group in self.producers:
            raise ClientStateError(
                f"producer group {member.group!r} is already registered in client instance {self.instance_name!r}"
            )
        self.producers[member.group] = member

    def add_consumer(self, member: ConsumerMember, *, heartbeat_interval_ms: int | None = None) -> None:
        if member.group in self.consumers:
            raise ClientStateError(
                f"consumer group {member.group!r} is already registered in client instance "
                f"{self.instance_name!r}; give each consumer of a group its own instance_name"
            )
        self.consumers[member.group] = member
        if heartbeat_interval_ms is not None and heartbeat_interval_ms < self.heartbeat_interval_ms:
            self.heartbeat_interval_ms = heartbeat_interval_ms
            self._wake_heartbeat.set()

    def remove_producer(self, group: str) -> None:
        self.producers.pop(group, None)

    def remove_consumer(self, group: str) -> None:
        self.consumers.pop(group, None)

    # --- requests -------------------------------------------------------------------------------------
    def _sign(self, cmd: RemotingCommand) -> RemotingCommand:
        if self.credentials is not None:
            extra = self.credentials(cmd)
            if extra:
                cmd.ext_fields = {**(cmd.ext_fields or {}), **extra}
        return cmd

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        """Send a request and return the response (any code); transport failures raise OrbitError."""
        if self.closed:
            raise ClientStateError("client instance is closed")
        if self._ensure_fresh is not None and (wait := self._ensure_fresh()) is not None:
            await wait  # no token yet, or it expired: the credentials fetch one
        try:
            return await self.remoting.invoke(addr, self._sign(cmd), timeout_ms or self.request_timeout_ms)
        except RemotingError as e:
            raise from_remoting(e) from e

    def invoke_raw(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> Awaitable[RemotingCommand]:
        """``invoke`` without its coroutine, for the send path: on an open client whose
        credentials (if any) need no fetch now, the connection's own future for the signed
        request, whose transport failures are RemotingErrors (the caller translates them with
        ``from_remoting``); a coroutine only while a token is being fetched, or on a closed
        client (``invoke`` itself)."""
        if self.closed:
            return self.invoke(addr, cmd, timeout_ms)
        if self._ensure_fresh is not None and (wait := self._ensure_fresh()) is not None:
            return self._invoke_after(wait, addr, cmd, timeout_ms)  # (asked once: wait is this fetch's)
        return self.remoting.invoke(addr, cmd if self.credentials is None else self._sign(cmd), timeout_ms)

    async def _invoke_after(
        self, wait: Awaitable[None], addr: str, cmd: RemotingCommand, timeout_ms: int
    ) -> RemotingCommand:
        await wait  # no token yet, or it expired: the credentials fetch one
        return await self.remoting.invoke(addr, self._sign(cmd), timeout_ms)

    def send_connection(self, addr: str) -> tuple[Connection, bytes] | None:
        """For the send path, which writes its own frames: the open connection to ``addr`` and
        the extFields text its requests carry besides their own — nothing without credentials, a
        bearer token's ``,"Authorization":"Bearer …"`` with one that can go as it is (the text made
        once a token). None when a request must take the command path instead: a closed client,
        credentials that sign each request (RocketMQ ACL), a token to fetch first, or no open
        connection."""
        if self.closed:
            return None
        extra = b""
        if self.credentials is not None:
            fresh = self._fresh_fields
            fields = fresh() if fresh is not None else None
            if not fields:
                return None
            made = self._auth_text
            if made[0] is not fields:
                text = b"".join(b',"%b":"%b"' % (json_text(k), json_text(v)) for k, v in fields.items())
                made = self._auth_text = (fields, text)
            extra = made[1]
        conn = self.remoting.open_connection(addr)
        return None if conn is None else (conn, extra)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        if self.closed:
            raise ClientStateError("client instance is closed")
        if self._ensure_fresh is not None and (wait := self._ensure_fresh()) is not None:
            await wait
        try:
            await self.remoting.invoke_oneway(addr, self._sign(cmd))
        except RemotingError as e:
            raise from_remoting(e) from e

    async def invoke_namesrv(self, cmd: RemotingCommand, timeout_ms: int | None = None) -> tuple[str, RemotingCommand]:
        """Ask the current name server; on a transport failure try the next ones in turn."""
        n = len(self.namesrv_addrs)
        last: OrbitError | None = None
        for i in range(n):
            addr = self.namesrv_addrs[(self._namesrv_index + i) % n]
            try:
                resp = await self.invoke(addr, cmd, timeout_ms)
            except OrbitError as e:
                if not e.retriable:
                    raise
                last = e
                continue
            self._namesrv_index = (self._namesrv_index + i) % n
            return addr, resp
        assert last is not None
        raise last

    # --- routes ---------------------------------------------------------------------------------------
    async def fetch_route(self, topic: str) -> TopicRoute | None:
        """Ask the name servers for a topic's route and cache it; None when it is unknown."""
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            addr, resp = await self.invoke_namesrv(protocol.route_request(topic))
            self.route_refresh.fetched(topic)
            data = protocol.parse_route_response(resp, addr)
            if data is None:
                return None
            route = parse_route(topic, data)
            old = self.routes.get(topic)
            self.routes[topic] = route
            if old is None or set(old.broker_addrs) != set(route.broker_addrs):
                self._wake_heartbeat.set()  # new brokers hear from us at once
            moved = old is not None and (
                old.subscribe_queues != route.subscribe_queues or old.broker_addrs != route.broker_addrs
            )
            if moved:  # queues added or removed, brokers changed: the topic's consumers rebalance now
                for c in list(self.consumers.values()):
                    if topic in set(c.topics()):
                        c.request_rebalance()
            return route

    def route_stale(self, mq: MessageQueue, error: OrbitError) -> None:
        """A broker answered ``error`` for ``mq``: the cached route of its topic is stale. A send
        refused (a queue not served, a topic not writable or not there) takes the refused
        queues out of the cached route's publish queues at once — the queue and those above it,
        or all of the broker's — so a retry goes to a writable queue; and the route is fetched
        again soon (``route_refresh``)."""
        # Not writable there, or not there at all: none of the broker's queues.
        self._write_queues_gone(mq, mq.queue_id if isinstance(error, QueueNotServedError) else 0)

    def queue_redirected(self, mq: MessageQueue) -> None:
        """A broker stored a send to ``mq`` in another queue (``mq`` is read-only there, being
        drained): the cached route is stale, as for a refusal, but nothing failed."""
        self._write_queues_gone(mq, mq.queue_id)

    def _write_queues_gone(self, mq: MessageQueue, from_queue: int) -> None:
        """Queues ``from_queue`` and up of ``mq``'s broker out of the cached route's publish
        queues at once, and the route fetched again soon."""
        route = self.routes.get(mq.topic)
        if route is not None:
            self.routes[mq.topic] = without_write_queues(route, mq.broker_name, from_queue)
        self.route_refresh.ask(mq.topic)

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        route = None if refresh else self.routes.get(topic)
        if route is None:
            route = await self.fetch_route(topic)
        if route is None:
            raise RouteNotFoundError(topic, missing=True)
        return route

    async def publish_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The route to send to: the topic's own, or — for a topic the name servers do not know
        yet — the default topic's (TBW102) brokers with up to 4 queues, so that the first send
        creates the topic on the broker (autoCreateTopicEnable). ``refresh``: ask the name
        servers, unless the route was fetched within ``route_refresh_min_interval_ms``."""
        if refresh and self.route_refresh.recent(topic):
            refresh = False
        route = None if refresh else self.routes.get(topic)
        if route is None or not route.publish_queues:
            route = await self.fetch_route(topic)
        if route is not None and route.publish_queues:
            return route
        _, resp = await self.invoke_namesrv(protocol.route_request(DEFAULT_TOPIC))
        data = protocol.parse_route_response(resp)
        if data is not None:
            borrowed = parse_route(topic, data, max_write_queues=protocol.DEFAULT_TOPIC_QUEUE_NUMS)
            if borrowed.publish_queues:
                for name, addrs in borrowed.broker_addrs.items():
                    self._remember_broker(name, addrs)
                return borrowed
        if route is not None:
            raise RouteNotFoundError(topic, "no broker takes writes for it")
        raise RouteNotFoundError(topic, "and no broker auto-creates topics", missing=True)

    def _remember_broker(self, name: str, addrs: dict[int, str]) -> None:
        self._extra_brokers[name] = addrs

    def broker_table(self) -> dict[str, dict[int, str]]:
        """Broker name → broker id → address, over every cached route."""
        table: dict[str, dict[int, str]] = {name: dict(a) for name, a in self._extra_brokers.items()}
        for route in self.routes.values():
            for name, addrs in route.broker_addrs.items():
                table.setdefault(name, {}).update(addrs)
        return table

    def find_broker_addr(self, broker_name: str, broker_id: int = MASTER_ID) -> str | None:
        """The address of a broker by id (a slave id the route lacks: any slave), else its
        master, else any of its addresses."""
        addrs = self.broker_table().get(broker_name)
        if not addrs:
            return None
        if broker_id != MASTER_ID and broker_id not in addrs:
            slaves = [i for i in addrs if i != MASTER_ID]
            if slaves:
                return addrs[min(slaves)]
        return addrs.get(broker_id) or addrs.get(MASTER_ID) or addrs[min(addrs)]

    def other_broker_id(self, broker_name: str, failed_addr: str) -> int:
        """After a request to ``failed_addr`` failed: the id of another broker of the group to
        try next (its master first, else a slave), or the master id when there is none."""
        addrs = self.broker_table().get(broker_name) or {}
        others = sorted(i for i, a in addrs.items() if a != failed_addr)
        return others[0] if others else MASTER_ID

    def cached_master_addr(self, mq: MessageQueue) -> str | None:
        """The queue's master from the topic's own cached route (the hot path), or None."""
        route = self.routes.get(mq.topic)
        if route is not None:
            addrs = route.broker_addrs.get(mq.broker_name)
            if addrs is not None:
                return addrs.get(MASTER_ID)
        return None

    async def broker_addr(self, mq: MessageQueue, broker_id: int = MASTER_ID, *, master_only: bool = False) -> str:
        """The address to send a queue's requests to; refreshes the route when it is unknown."""
        if master_only or broker_id == MASTER_ID:
            addr = self.cached_master_addr(mq)
            if addr is not None:
                return addr
        for refresh in (False, True):
            if refresh:
                await self.fetch_route(mq.topic)
            if master_only:
                addr = self.broker_table().get(mq.broker_name, {}).get(MASTER_ID)
            else:
                addr = self.find_broker_addr(mq.broker_name, broker_id)
            if addr is not None:
                return addr
        raise BrokerNotFoundError(f"no address for broker {mq.broker_name!r} (queue {mq})")

    async def _route_loop(self) -> None:
        while True:
            await wait_event(self._wake_route_loop, self.route_refresh_interval_ms / 1000)
            if self._wake_route_loop.is_set():  # a shorter interval: the next round after it
                self._wake_route_loop.clear()
                continue
            topics: set[str] = set()
            for p in list(self.producers.values()):
                topics.update(p.topics())
            for c in list(self.consumers.values()):
                topics.update(c.topics())
            for topic in sorted(topics):
                try:
                    await self.fetch_route(topic)
                except OrbitError as e:
                    log.warning("route refresh of %s failed: %s", topic, e)
                except Exception:
                    log.exception("route refresh of %s failed", topic)

    # --- heartbeats ---------------------------------------------------------------------------------------
    def heartbeat_data(self) -> bodies.HeartbeatData:
        return {
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in sorted(self.producers)],
            "consumerDataSet": [self.consumers[g].consumer_data() for g in sorted(self.consumers)],
        }

    async def send_heartbeat_to_all_brokers(self) -> int:
        """One HEART_BEAT to every known broker (slaves only when there are consumers); returns
        how many brokers answered SUCCESS."""
        if not self.producers and not self.consumers:
            return 0
        data = self.heartbeat_data()
        addrs: set[str] = set()
        for by_id in self.broker_table().values():
            for bid, addr in by_id.items():
                if bid == MASTER_ID or self.consumers:
                    addrs.add(addr)

        async def one(addr: str) -> bool:
            try:
                resp = await self.invoke(addr, protocol.heartbeat_request(data))
                protocol.check(resp, addr)
                return True
            except OrbitError as e:
                log.info("heartbeat to %s failed: %s", addr, e)
                return False

        results = await asyncio.gather(*(one(a) for a in sorted(addrs)))
        return sum(results)

    async def _heartbeat_loop(self) -> None:
        while True:
            await wait_event(self._wake_heartbeat, self.heartbeat_interval_ms / 1000)
            self._wake_heartbeat.clear()
            try:
                await self.send_heartbeat_to_all_brokers()
            except Exception:
                log.exception("heartbeat round failed")

    async def unregister(self, *, producer_group: str = "", consumer_group: str = "", timeout_ms: int = 1000) -> None:
        """Tell every broker a group member left (best effort)."""
        addrs = {a for by_id in self.broker_table().values() for a in by_id.values()}

        async def one(addr: str) -> None:
            cmd = protocol.unregister_request(
                self.client_id, producer_group=producer_group, consumer_group=consumer_group
            )
            try:
                await self.invoke(addr, cmd, timeout_ms)
            except OrbitError as e:
                log.info("unregister from %s failed: %s", addr, e)

        await asyncio.gather(*(one(a) for a in sorted(addrs)))

    # --- group membership -----------------------------------------------------------------------------
    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        """The client ids of a group's consumers, as a broker of the topic knows them."""
        route = await self.route(topic)
        names = route.brokers()
        if not names:
            return []
        last: OrbitError | None = None
        for name in names:
            addr = self.find_broker_addr(name)
            if addr is None:
                continue
            try:
                resp = await self.invoke(addr, protocol.consumer_list_request(group))
                return protocol.parse_consumer_list_response(resp, addr)
            except OrbitError as e:
                last = e
        if last is not None:
            raise last
        return []

    def _on_consumer_ids_changed(self, conn: Connection, cmd: RemotingCommand) -> None:
        group = (cmd.ext_fields or {}).get("consumerGroup", "")
        consumer = self.consumers.get(group)
        log.info("consumer ids of group %s changed (from %s)", group, conn.peer)
        if consumer is not None:
            consumer.request_rebalance()

    def _on_check_transaction_state(self, conn: Connection, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE (39, oneway): a broker asks the producer group named by the half
        message's PGROUP; a ``TransactionProducer`` answers with END_TRANSACTION (sdk.transaction_producer)."""
        try:
            msg = protocol.decode_messages(cmd.body_bytes(), "")[0]
        except (OrbitError, IndexError) as e:
            log.warning("CHECK_TRANSACTION_STATE from %s has no readable message: %s", conn.peer, e)
            return
        group = msg.properties.get("PGROUP", "")
        check = getattr(self.producers.get(group), "check_transaction_state", None)
        if check is None:
            log.warning("transaction check from %s for group %r: no transactional producer here", conn.peer, group)
            return
        check(conn.peer, msg, cmd.ext_fields or {})


# --- the per-process registry -----------------------------------------------------------------------------
_instances: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[object, ...], ClientInstance]] = (
    weakref.WeakKeyDictionary()
)


async def acquire_instance(
    namesrv_addrs: str | Sequence[str],
    *,
    instance_name: str = "DEFAULT",
    credentials: Credentials | TokenProvider | None = None,
    tls: ssl.SSLContext | None = None,
    **options: int,
) -> ClientInstance:
    """The shared instance for these name servers, instance name and credentials hook on the
    running loop (created on first use); the caller must ``release`` it."""
    loop = asyncio.get_running_loop()
    table = _instances.setdefault(loop, {})
    key = (_split_namesrv(namesrv_addrs), instance_name, id(credentials) if credentials else None, id(tls))
    inst = table.get(key)
    if inst is None or inst.closed:
        inst = ClientInstance(namesrv_addrs, instance_name=instance_name, credentials=credentials, tls=tls, **options)
        table[key] = inst

        def forget(i: ClientInstance, key: tuple[object, ...] = key) -> None:
            if table.get(key) is i:
                del table[key]

        inst.on_close = forget
    elif "route_refresh_interval_ms" in options:
        inst.shorten_route_refresh(options["route_refresh_interval_ms"])
    await inst.acquire()
    return inst
