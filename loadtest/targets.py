"""What a load test runs against, and the clients generators use for it.

A *target spec* is a small picklable dict handed to every generator process:
``{"kind": "orbit", "namesrv": "host:port", "credentials": {...} | None}``, or a peer's
(``loadtest/peers``). ``publisher(spec)`` and ``subscriber(spec, ...)`` build the matching
client inside the generator process.

``OrbitServer`` starts a LocalCluster for a case (flush type, broker role, store settings,
tenancy) and makes its topics — through the control plane's HTTP API when the case has tenants,
so the generators go through the real auth path with credentials of their own.
``RemoteOrbit`` is an Orbit cluster somebody else runs (distributed use)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from loadtest.scenario import Case


class TargetUnavailable(RuntimeError):
    """A case cannot run against this target here; the message says why."""


class Publisher(Protocol):
    async def start(self) -> None: ...
    async def send(self, topic: str, bodies: list[bytes], key: str | None) -> None: ...
    async def close(self) -> None: ...


class Subscriber(Protocol):
    async def run(self, on_batch: Callable[[list[bytes]], None], stop: asyncio.Event) -> None: ...


class Server(Protocol):
    kind: str

    def start(self) -> dict[str, Any]: ...
    def prepare(self, spec: dict[str, Any], *, topics: list[str], queues: int) -> None: ...
    def stop(self) -> None: ...


def tenant_name(index: int) -> str:
    """Tenant ``index`` of a tenant case; tenant 0 is the noisy one."""
    return f"lt-t{index}"


def topic_names(case: Case, tenant: str | None = None) -> list[str]:
    prefix = f"{tenant}%" if tenant else ""
    return [f"{prefix}lt-{i}" for i in range(case.topics)]


def group_names(case: Case, tenant: str | None = None) -> list[str]:
    prefix = f"{tenant}%" if tenant else ""
    return [f"{prefix}lt-group-{i}" for i in range(case.consumer_groups)]


def _route_options(spec: dict[str, Any]) -> dict[str, Any]:
    """The SDK's route refresh interval when the spec sets one (an elastic case: routes change)."""
    ms = spec.get("route_refresh_ms")
    return {"route_refresh_interval_ms": int(ms)} if ms else {}


def _credentials(spec: dict[str, Any]) -> Any:
    c = spec.get("credentials")
    if not c:
        return None
    from sdk.credentials import AccessKeyCredentials, ClientCredentials

    if c.get("token_url"):
        return ClientCredentials(c["access_key"], c["secret"], c["token_url"])
    return AccessKeyCredentials(c["access_key"], c["secret"])


async def _close(credentials: Any) -> None:
    """A token provider holds an HTTP session; close it with the client."""
    aclose = getattr(credentials, "aclose", None)
    if aclose is not None:
        await aclose()


class OrbitPublisher:
    def __init__(self, spec: dict[str, Any], *, instance: str) -> None:
        from sdk import Producer

        self.credentials = _credentials(spec)
        self.producer = Producer(
            "lt-producers",
            namesrv_addrs=[spec["namesrv"]],
            credentials=self.credentials,
            instance_name=instance,
            **_route_options(spec),
        )

    async def start(self) -> None:
        await self.producer.start()

    async def send(self, topic: str, bodies: list[bytes], key: str | None) -> None:
        from sdk import Message

        if len(bodies) == 1:
            await self.producer.send(Message(topic, bodies[0]), sharding_key=key)
        else:
            await self.producer.send_batch([Message(topic, b) for b in bodies])

    async def close(self) -> None:
        await self.producer.shutdown()
        await _close(self.credentials)


class OrbitSubscriber:
    def __init__(self, spec: dict[str, Any], *, group: str, topics: list[str], ordered: bool) -> None:
        self.spec, self.group, self.topics, self.ordered = spec, group, topics, ordered

    async def run(self, on_batch: Callable[[list[bytes]], None], stop: asyncio.Event) -> None:
        from sdk import ConsumeResult, PushConsumer

        credentials = _credentials(self.spec)
        consumer = PushConsumer(
            self.group,
            namesrv_addrs=[self.spec["namesrv"]],
            credentials=credentials,
            consume_from="FIRST_OFFSET",
            consume_batch_size=32,
            pull_batch_size=32,
            rebalance_interval_ms=2000,
            instance_name=f"lt-{os.getpid()}-{self.group}",
            **_route_options(self.spec),
        )
        for t in self.topics:
            consumer.subscribe(t, "*")

        async def listener(msgs: list[Any]) -> ConsumeResult:
            on_batch([m.body for m in msgs])
            return ConsumeResult.SUCCESS

        if self.ordered:
            consumer.on_message_orderly(listener)
        else:
            consumer.on_message(listener)
        await consumer.start()
        try:
            await stop.wait()
        finally:
            await consumer.shutdown()
            await _close(credentials)


def publisher(spec: dict[str, Any], *, instance: str) -> Publisher:
    kind = spec["kind"]
    if kind == "orbit":
        return OrbitPublisher(spec, instance=instance)
    if kind == "nats":
        from loadtest.peers.nats import NatsPublisher

        return NatsPublisher(spec)
    from loadtest.peers.redis import RedisPublisher

    return RedisPublisher(spec)


def subscriber(spec: dict[str, Any], *, group: str, topics: list[str], ordered: bool) -> Subscriber:
    kind = spec["kind"]
    if kind == "orbit":
        return OrbitSubscriber(spec, group=group, topics=topics, ordered=ordered)
    if kind == "nats":
        from loadtest.peers.nats import NatsSubscriber

        return NatsSubscriber(spec, group=group, topics=topics, ordered=ordered)
    from loadtest.peers.redis import RedisSubscriber

    return RedisSubscriber(spec, group=group, topics=topics, ordered=ordered)


def peer_server(kind: str, root: str) -> Server:
    if kind == "nats":
        from loadtest.peers.nats import NatsServer

        return NatsServer(root)
    from loadtest.peers.redis import RedisServer

    return RedisServer(root)


def durability(kind: str, case: Case) -> str:
    if kind == "nats":
        from loadtest.peers.nats import DURABILITY

        return DURABILITY
    if kind == "redis":
        from loadtest.peers.redis import DURABILITY as REDIS_DURABILITY

        return REDIS_DURABILITY
    flush = (
        "SYNC_FLUSH: a send is answered once its bytes are fsynced (group commit)"
        if case.flush == "SYNC_FLUSH"
        else "ASYNC_FLUSH: answered once in the mapped CommitLog (page cache), flushed every 500 ms"
    )
    role = " ; SYNC_MASTER: and once a slave holds the bytes" if case.broker_role == "SYNC_MASTER" else ""
    return flush + role


@dataclasses.dataclass
class TenantAccess:
    """One tenant's wire names and credential (kept in memory and in generator arguments only —
    never written to results or logs)."""

    tenant: str
    topics: list[str]
    groups: list[str]
    spec: dict[str, Any]


class OrbitServer:
    """A LocalCluster for one case."""

    kind = "orbit"

    def __init__(self, root: str, case: Case) -> None:
        self.root = root
        self.case = case
        self.cluster: Any = None
        self.tenants: list[TenantAccess] = []
        self.queue_watch: Any = None  # an elastic case's (loadtest/elastic.py)

    def start(self) -> dict[str, Any]:
        from data_plane.local_cluster import LocalCluster

        case = self.case
        flags: list[str] = []
        for k, v in case.store_set:
            flags += ["--store-set", f"{k}={v}"]
        for k, v in case.broker_set:
            flags += ["--set", f"{k}={v}"]
        options: dict[str, Any] = {}
        auto = case.autoscale
        if auto is not None:
            from loadtest.elastic import cluster_options

            extra, more = cluster_options(auto)
            options.update(extra)
            flags = [*more, *flags]  # the case's own --set after: they win
        if case.slaves:  # LocalCluster gives the master its role and each slave its own
            have = {f.name for f in dataclasses.fields(LocalCluster)}
            if not {"slaves", "master_role"} <= have:
                raise TargetUnavailable(
                    "this LocalCluster cannot start slave brokers (no 'slaves'/'master_role' options); "
                    "the replication case needs a master and a slave"
                )
            options.update(slaves=case.slaves, master_role=case.broker_role)
        self.cluster = LocalCluster(
            self.root,
            namesrv_port=0,
            broker_port=0,
            flush=case.flush,
            broker_flags=flags,
            tenancy=case.tenants is not None or auto is not None,
            control_plane_port=0,
            **options,
        )
        self.cluster.start()
        spec = {"kind": "orbit", "namesrv": self.cluster.namesrv, "credentials": None}
        if auto is not None:
            spec["route_refresh_ms"] = auto.route_refresh_ms
        return spec

    def members(self) -> list[str]:
        """The brokers that ran (names only), for the result."""
        return sorted(self.cluster.brokers) if self.cluster is not None else []

    def broker_sample(self) -> dict[str, float]:
        """The brokers' CPU seconds so far (user + system, summed) and, under tenancy, the
        publishes they refused for a quota (off the frame and on the command path), asked with
        the operator's credential: two samples around a case give what the case cost them."""
        out = {"cpu_s": 0.0, "quota_refusals": 0.0, "quota_early_refusals": 0.0}
        children = [c for c in self.cluster.children if c.name.startswith("broker")] if self.cluster else []
        for c in children:
            with open(f"/proc/{c.proc.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            out["cpu_s"] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if (self.case.tenants is None and self.case.autoscale is None) or not children:
            return out
        from data_plane.dev_tenancy import read_credentials
        from sdk.admin import AdminClient
        from sdk.credentials import AccessKeyCredentials

        creds = read_credentials(os.path.join(self.root, "control-plane", "operator.json"))
        assert creds is not None

        async def go() -> None:
            async with AdminClient([self.cluster.namesrv], credentials=AccessKeyCredentials(*creds)) as admin:
                for c in children:
                    info = await admin.broker_status(c.address)
                    out["quota_refusals"] += float(info.get("quotaRefusals", 0))
                    out["quota_early_refusals"] += float(info.get("quotaEarlyRefusals", 0))

        asyncio.run(go())
        return out

    def prepare(self, spec: dict[str, Any], *, topics: list[str], queues: int) -> None:
        if self.case.autoscale is not None:
            from loadtest.elastic import QueueWatch, make_tenant

            url = self.cluster.control_plane_url
            access = make_tenant(url, self.root, self.case, spec)
            self.tenants = [access]
            topic = topic_names(self.case)[0]
            self.queue_watch = QueueWatch(url, self.root, access.tenant, topic, self.case.autoscale.sample_s)
        elif self.case.tenants is None:
            create_topics(spec, topics, queues)
        else:
            self.tenants = self._make_tenants(spec)

    def _make_tenants(self, spec: dict[str, Any]) -> list[TenantAccess]:
        """Tenants ``lt-t0`` (the noisy one) .. ``lt-t<n-1>``, each with the case's publish quota, its
        topics, groups and a credential, made through the control plane's HTTP API."""
        from data_plane.dev_tenancy import operator_api

        case = self.case
        assert case.tenants is not None
        url = self.cluster.control_plane_url
        api = operator_api(url, os.path.join(self.root, "control-plane", "operator.json"))
        out = []
        for i in range(case.tenants.count):
            t = tenant_name(i)
            api.ok("POST", "/v1/tenants", {"id": t, "plan": "enterprise", "display_name": f"load test {t}"})
            api.ok("PUT", f"/v1/tenants/{t}/quota", _quota(case.tenants, noisy=i == 0))
            for name in topic_names(case):
                api.ok("POST", f"/v1/tenants/{t}/topics", {
                    "name": name, "message_type": "NORMAL", "throughput_hint_msgs_per_s": case.queues * 1000
                })  # fmt: skip
            for name in group_names(case):
                api.ok("POST", f"/v1/tenants/{t}/groups", {"name": name})
            made = api.ok("POST", f"/v1/tenants/{t}/credentials", {"description": "orbit loadtest"})
            creds = {"access_key": made["access_key"], "secret": made["secret"], "token_url": url + "/oauth/token"}
            out.append(TenantAccess(t, topic_names(case, t), group_names(case, t), {**spec, "credentials": creds}))
        deadline = time.monotonic() + 60
        for access in out:
            for name in topic_names(case):
                while api.ok("GET", f"/v1/tenants/{access.tenant}/topics/{name}").get("status") != "active":
                    if time.monotonic() > deadline:
                        raise TargetUnavailable(f"topic {access.tenant}%{name} did not become active within 60 s")
                    time.sleep(0.2)
        if case.tenants.noisy_backlog_msgs:
            store_backlog(out[0], case.tenants.noisy_backlog_msgs, case.message_bytes[1])
        return out

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


BACKLOG_PUBLISH_QUOTA = 10_000_000  # msgs/s: the noisy tenant's while its backlog is stored
BACKLOG_BATCH = 32
BACKLOG_IN_FLIGHT = 16


def _quota(tenants: Any, *, noisy: bool) -> dict[str, int]:
    """A tenant's quota override: the case's publish quota; for the noisy tenant of a backlog
    case, none to speak of on publishing (its backlog is stored before the run) and the case's
    consume quota; for the noisy tenant of a burst case, its own publish quota."""
    if noisy and tenants.noisy_backlog_msgs:
        quota = {"publish_msgs_per_s": BACKLOG_PUBLISH_QUOTA}
        if tenants.noisy_consume_quota_msgs_per_s:
            quota["consume_msgs_per_s"] = tenants.noisy_consume_quota_msgs_per_s
        return quota
    if noisy and tenants.noisy_publish_quota_msgs_per_s:
        return {"publish_msgs_per_s": tenants.noisy_publish_quota_msgs_per_s}
    return {"publish_msgs_per_s": tenants.publish_quota_msgs_per_s}


def store_backlog(access: TenantAccess, n: int, message_bytes: int) -> None:
    """Store ``n`` messages of ``message_bytes`` on the tenant's topics before the run, in
    batches, spread over them:
    bodies with the generators' header and a send time of 0, so consumers count them but no
    latency is measured from them."""
    from loadtest.workers import HEADER
    from sdk import Message, Producer

    pad = b"b" * max(0, message_bytes - HEADER.size)

    async def go() -> None:
        credentials = _credentials(access.spec)
        producer = Producer(
            f"{access.tenant}%lt-backlog", namesrv_addrs=[access.spec["namesrv"]], credentials=credentials
        )
        await producer.start()
        try:
            sent = 0
            sem = asyncio.Semaphore(BACKLOG_IN_FLIGHT)

            async def one(first: int, topic: str) -> None:
                try:
                    count = min(BACKLOG_BATCH, n - first)
                    await producer.send_batch(
                        [Message(topic, HEADER.pack(0, 0xFFFFFFFF, 0, first + i) + pad) for i in range(count)]
                    )
                finally:
                    sem.release()

            tasks = []
            while sent < n:
                await sem.acquire()
                topic = access.topics[(sent // BACKLOG_BATCH) % len(access.topics)]
                tasks.append(asyncio.ensure_future(one(sent, topic)))
                sent += BACKLOG_BATCH
            await asyncio.gather(*tasks)
        finally:
            await producer.shutdown()
            await _close(credentials)

    asyncio.run(go())


class RemoteOrbit:
    """An Orbit cluster run elsewhere (generator-only mode): nothing to start or stop."""

    kind = "orbit"

    def __init__(self, spec: dict[str, Any], *, create_topics: bool) -> None:
        self.spec = spec
        self.create = create_topics
        self.tenants: list[TenantAccess] = []

    def start(self) -> dict[str, Any]:
        return self.spec

    def prepare(self, spec: dict[str, Any], *, topics: list[str], queues: int) -> None:
        if self.create:
            create_topics(spec, topics, queues)

    def stop(self) -> None:
        pass


def create_topics(spec: dict[str, Any], topics: list[str], queues: int) -> None:
    from sdk.admin import AdminClient

    async def go() -> None:
        async with AdminClient([spec["namesrv"]], credentials=_credentials(spec), timeout_ms=30_000) as admin:
            for t in topics:
                await admin.create_topic(t, queue_nums=queues)

    asyncio.run(go())
