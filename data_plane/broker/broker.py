"""Broker: the message store behind RocketMQ's request processors, registered with the name
servers.

    RemotingServer ─▶ Processors ─▶ SendProcessor ─▶ MessageStore.append ─▶ PullRequestHoldService.notify
                               ├─▶ PullProcessor ─▶ MessageStore.get_message (memoryview slices → socket)
                               ├─▶ ClientProcessor (heartbeats, consumer lists, queue locks)
                               └─▶ AdminProcessor (topics, groups, offsets, queries)

Everything runs on one event loop; the store's disk work runs on its own service threads.
Every ``register_interval_s`` (30 s) — and at once when topics change — the broker sends
REGISTER_BROKER with its topic table to every name server. State kept across restarts lives in
``<store_dir>/config`` (topics, consumer offsets, subscription groups) and ``<store_dir>/store``.

Telemetry (``config.telemetry`` "console" | "otlp", or a ``Telemetry`` passed in): the send and
pull handlers are registered wrapped in spans (``send.traced_send``, ``pull.traced_pull``) and
``on_stored`` / ``on_pulled`` count messages and bytes per tenant and topic (``BrokerMetrics``).
Off ("none", the default), the handlers are the plain ones and the only cost is one ``is None``
check per stored or served batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from data_plane.auth.signature import ACCESS_KEY, SIGNATURE, sign
from data_plane.broker import trace
from data_plane.broker.admin import AdminProcessor
from data_plane.broker.client_manager import ClientManager
from data_plane.broker.client_processor import ClientProcessor
from data_plane.broker.config import BrokerConfig, BrokerRole, advertised_address
from data_plane.broker.consumer_filter import ConsumerFilterManager
from data_plane.broker.consumer_offset import ConsumerOffsetManager
from data_plane.broker.gc_watch import GcWatch
from data_plane.broker.long_poll import PullRequestHoldService
from data_plane.broker.open_files import raise_open_files_limit
from data_plane.broker.persisted import SaveBehind
from data_plane.broker.pull import PullHandler, PullProcessor
from data_plane.broker.rebalance_lock import RebalanceLockManager
from data_plane.broker.replication import Replication
from data_plane.broker.schedule import Schedule
from data_plane.broker.send import SendHandler, SendProcessor
from data_plane.broker.send_back import SendBackProcessor
from data_plane.broker.stall_watch import StallWatch
from data_plane.broker.subscription_group import SubscriptionGroupManager
from data_plane.broker.tenancy import BrokerTenancy, load_broker_credentials
from data_plane.broker.topic_config import TopicConfigManager
from data_plane.broker.trace import MessageTrace
from data_plane.broker.transaction import TransactionalMessageService
from data_plane.broker.transaction_check import TransactionCheckService
from data_plane.loop_stall import STALL_LIMIT_MS, LoopStallGauge
from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import RemotingError
from data_plane.remoting.server import Processors, RemotingServer
from data_plane.store import MessageStore, fastpath
from data_plane.store.idle_queues import IdleQueues
from data_plane.store.message import Message
from data_plane.tasks import cancel_all
from data_plane.tls import client_context

if TYPE_CHECKING:
    from data_plane.broker.failover import FailoverAgent
    from data_plane.broker.pop import PopService
    from data_plane.proxy.server import GrpcEndpoint
    from data_plane.remoting.command import Body
    from data_plane.telemetry import BrokerMetrics, Telemetry

log = logging.getLogger(__name__)

BeforePut = Callable[[Connection, RemotingCommand, list[Message]], "RemotingCommand | None"]
# The same for a plain batch body (send.py): (request, topic, messages, body bytes).
BeforePutPlain = Callable[[RemotingCommand, str, int, int], "RemotingCommand | None"]


class Broker:
    def __init__(self, config: BrokerConfig, *, telemetry: Telemetry | None = None) -> None:
        self.config = config
        # Given (tests, embedding: the caller shuts it down) or made in start() from config.telemetry.
        self.telemetry: Telemetry | None = telemetry
        self._owns_telemetry = False
        self.metrics: BrokerMetrics | None = None  # None unless telemetry is on
        self.processors = Processors()
        self.server = RemotingServer(
            self.processors,
            host=config.listen_host,
            port=config.listen_port,
            max_frame_bytes=config.max_frame_bytes,
            idle_timeout_s=config.idle_timeout_s,
            answer_slice=config.answer_slice,
            max_inflight=config.max_requests_in_flight_per_connection,
            on_close=self._connection_closed,
            limits=config.inbound_limits,
            tls=config.server_tls,
        )
        conf_dir = os.path.join(config.store_dir, "config")
        self.topics = TopicConfigManager(
            os.path.join(conf_dir, "topics.json"),
            broker_name=config.broker_name,
            # With auth on, tenants' topics and groups come from the control plane only.
            auto_create=config.auto_create_topic_enable and not config.auth_enabled,
            default_queue_nums=config.default_topic_queue_nums,
            max_queue_nums=config.max_topic_queue_nums,
        )
        self.offsets = ConsumerOffsetManager(os.path.join(conf_dir, "consumerOffset.json"))
        self.groups = SubscriptionGroupManager(
            os.path.join(conf_dir, "subscriptionGroup.json"),
            auto_create=config.auto_create_subscription_group and not config.auth_enabled,
        )
        self.clients = ClientManager(channel_expired_s=config.channel_expired_s)
        self.locks = RebalanceLockManager(expiry_s=config.rebalance_lock_expiry_s)
        self.hold = PullRequestHoldService(config.max_held_pulls, config.max_held_pulls_per_connection)
        self._offsets_behind: SaveBehind | None = None  # set in start() (_persist_loop)
        self.schedule = Schedule(config)  # delayed and timed messages (started on a master)
        self.consumer_filter = ConsumerFilterManager(enabled=config.enable_property_filter)  # SQL92
        self.trace: MessageTrace | None = None  # set in start() when trace_enabled (trace.py)
        # From the address it serves on when that is one address (the one the fleet lists).
        wildcard = config.listen_host in ("", "0.0.0.0", "::")
        self.namesrv_client = RemotingClient(
            local_host=None if wildcard else config.listen_host,
            ssl_context=client_context(ca_file=config.tls_ca_file) if config.tls_ca_file else None,
        )
        # Registrations are signed (RocketMQ ACL) with this broker's credential when it has one:
        # the name servers of a multi-tenant cluster take registrations from brokers only.
        self._namesrv_credential: tuple[str, str] | None = None
        if config.broker_credentials_file:
            self._namesrv_credential = load_broker_credentials(config.broker_credentials_file)
        self._registered: set[str] = set()  # name servers whose last registration was accepted
        self.store: MessageStore = None  # type: ignore[assignment]  # set in start(), once the port is known
        self.idle_queues: IdleQueues = None  # type: ignore[assignment]  # set in start(), with the store
        self.address = ""
        self.replication: Replication = None  # type: ignore[assignment]  # set in start()
        # Kept by replication.py: this broker's role now, and whether the send path may write
        # (False on a slave and on a fenced master).
        self.is_master = config.is_master
        self.writable = config.is_master and not config.failover_enabled
        self.failover: FailoverAgent | None = None
        self.pop: PopService | None = None  # lease-based consumption, with the gRPC endpoint
        self.grpc: GrpcEndpoint | None = None
        # The plain single send for the gRPC endpoint (SendProcessor.put_plain), where the
        # remoting frame path is taken too; None: every v5 send goes through the send handler.
        self.put_plain: Callable[[Any, str, int, int, str | bytes, Body], int | None] | None = None
        self.put_plain_batch: Callable[[Any, str, int, int, bytes], int | None] | None = None  # (put_plain_batch)
        self.before_put: BeforePut | None = None  # the publish quota (BrokerTenancy.before_put)
        self.before_put_plain: BeforePutPlain | None = None  # ... of a plain batch body (before_put_plain)
        self.tenancy: BrokerTenancy | None = None
        self.transactions: TransactionalMessageService = None  # type: ignore[assignment]  # set in start()
        self.transaction_check: TransactionCheckService | None = None  # masters only (transaction_check.py)
        self.started_at = time.time()
        self.stats = {"put_msgs": 0, "put_bytes": 0, "get_msgs": 0, "get_bytes": 0}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self.gc_watch = GcWatch()
        self.stall_watch = StallWatch(config.loop_stall_watch_ms) if config.loop_stall_watch_ms > 0 else None
        # How late the loop runs what is due, from start-up on (loopStallMaxMs, loopStallsOver100ms)
        self.loop_stall = LoopStallGauge(report_over_ms=config.loop_lag_warn_ms, on_stall=self._loop_stalled)
        self._register_soon = False
        self._stopping = False

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        # Measured from the first moment: a slave's first handshake may truncate its log.
        self._tasks.append(asyncio.get_running_loop().create_task(self.loop_stall.run(), name="orbit-loop-stall"))
        await self.server.start(serving=False)
        self.address = advertised_address(self.config, self.server.port)
        os.makedirs(self.config.store_dir, exist_ok=True)
        self.store = MessageStore(self.config.store_config(self.server.port))
        await asyncio.to_thread(self.store.start)
        self.idle_queues = IdleQueues(self.store, self.config.idle_queue_close_s)
        # Answers leave only after the records they acknowledge are in the CommitLog file.
        self.server.before_write = self.store.write_staged
        self.topics.load()
        self.topics.on_written = self._topic_written
        self.offsets.load()
        self.groups.load()
        self.topics.persist()
        # From now on topic and group changes are saved on a worker thread (persisted.py)
        self.topics.save_behind = SaveBehind(self.topics.file, self.topics.snapshot, "topics")
        self.groups.save_behind = SaveBehind(self.groups.file, self.groups.snapshot, "subscription groups")
        # (consumer offsets: saved behind every consumer_offset_persist_interval_s, _persist_loop)
        self._offsets_behind = SaveBehind(self.offsets.file, self.offsets.snapshot, "consumer offsets")
        self.tenancy = BrokerTenancy(self)
        await self.tenancy.start()
        self.before_put = self.tenancy.before_put
        self.before_put_plain = self.tenancy.before_put_plain
        self.replication = Replication(self)
        if self.store is not None and self.store.tier is not None:
            self.store.tier_safe_offset = self.replication.tier_safe_offset
        # With failover on, a master starts its master-only services once the control plane
        # confirms it (on_became_master); a slave when it is promoted.
        if self.replication.writable:
            await self.schedule.start(self.store, self.hold.notify)
        if self.config.auth_enabled:
            self.processors.before = self.tenancy.before
            self.processors.checked_frame_handler = self.tenancy.refuse_send_early
        if self.tenancy is not None and self.config.quota_throttle_max_ms > 0:
            self.server.on_flow_control = self.tenancy.throttle
        self._start_telemetry()
        self.trace = trace.install(self)
        self.transactions = TransactionalMessageService.for_broker(self)
        if self.replication.writable:
            self._start_transaction_check()
        await self.replication.start()
        self.store.start_tiering()  # (now that the store's fence and the group's agreed offset are set)
        self._register_processors()
        if cfg_grpc := self.config.grpc_listen:
            from data_plane.broker.pop import PopService
            from data_plane.proxy.server import GrpcEndpoint

            self.pop = PopService(self)
            self.hold.on_notify = self.pop.on_stored
            if self.replication.writable:
                await asyncio.to_thread(self.pop.recover)  # which groups consume by lease, before serving
            self.grpc = GrpcEndpoint(self)
            await self.grpc.bind()
            await self.grpc.start(self.address.rpartition(":")[0])
            log.info("gRPC listen %s", cfg_grpc)
        await self.server.start_serving()
        self.gc_watch.install()
        loop = asyncio.get_running_loop()
        if self.stall_watch is not None:
            self.stall_watch.start(loop)
        self._tasks += [
            loop.create_task(self._register_loop()),
            loop.create_task(self._persist_loop()),
            loop.create_task(self._scan_clients_loop()),
            loop.create_task(self.store.run_maintenance()),
            loop.create_task(self.idle_queues.run(), name="orbit-idle-queues"),
            *([loop.create_task(self.trace.run())] if self.trace is not None else []),
        ]
        if self.config.failover_enabled:  # first: the control plane says what this broker is
            from data_plane.broker.failover import FailoverAgent

            self.failover = FailoverAgent(self)
            await self.failover.start()
        if self.config.namesrv_addrs:
            await self.register_all()
        log.info("broker %s (%s) serving on %s", self.config.broker_name, self.config.broker_role.value, self.address)

    def _start_transaction_check(self) -> None:
        self.transaction_check = TransactionCheckService.for_broker(self, self.transactions)
        self.transaction_check.load()
        task = asyncio.get_running_loop().create_task(self.transaction_check.run(), name="orbit-tx-check")
        self._tasks.append(task)

    async def on_became_master(self) -> None:
        """Promoted (failover): the master-only services start, the name servers hear at once."""
        if self.pop is not None:
            self.pop.recovered = False  # rebuilt from the replicated journal on first use
        if self.schedule.levels is None:
            await self.schedule.start(self.store, self.hold.notify)
        if self.transaction_check is None:
            self._start_transaction_check()
        self.replication.adopt_stored_topics()
        await self.register_all()

    async def on_became_slave(self) -> None:
        """Demoted (failover): the master-only services stop before the log is truncated."""
        if self.pop is not None:
            self.pop.recovered = False
        await self.schedule.stop()
        self.schedule = Schedule(self.config)
        if self.transaction_check is not None:
            self.transaction_check = None
            checks = [t for t in self._tasks if t.get_name() == "orbit-tx-check"]
            self._tasks = [t for t in self._tasks if t not in checks]
            await cancel_all(checks)
        self.hold.wake_all()

    def _start_telemetry(self) -> None:
        cfg = self.config
        if self.telemetry is None:
            if cfg.telemetry == "none":
                return
            from data_plane.telemetry import parse_setting, setup_telemetry

            self.telemetry = setup_telemetry(
                "orbit-broker",
                exporter=parse_setting(cfg.telemetry),
                resource_attributes={
                    "service.instance.id": f"{cfg.broker_name}@{self.address}",
                    "orbit.broker.name": cfg.broker_name,
                    "orbit.cluster.name": cfg.cluster_name,
                },
            )
            self._owns_telemetry = True
        if self.telemetry.enabled:
            from data_plane.telemetry import (
                BrokerMetrics,
                register_auth_refusals,
                register_forced_deletions,
                register_ha_link_refusals,
                register_remoting_refusals,
                register_replication_lag,
            )

            self.metrics = BrokerMetrics(self.telemetry)
            register_replication_lag(self.telemetry, self.replication.lag, broker_name=cfg.broker_name)
            register_remoting_refusals(self.telemetry, self.server.guard.refused, broker_name=cfg.broker_name)
            register_ha_link_refusals(self.telemetry, self.replication.link_refused, broker_name=cfg.broker_name)
            if self.tenancy is not None and self.tenancy.enabled:
                register_auth_refusals(self.telemetry, self.tenancy.refusals.counts, broker_name=cfg.broker_name)
            if self.tenancy is not None:
                register_forced_deletions(
                    self.telemetry, self.tenancy.forced_deletions.messages, broker_name=cfg.broker_name
                )
            log.info("telemetry on (%s)", self.telemetry.exporter)

    def _register_processors(self) -> None:
        p = self.processors
        send = SendProcessor(self)
        pull = PullProcessor(self)
        client = ClientProcessor(self)
        admin = AdminProcessor(self)
        send_v1: SendHandler = send.send_v1
        send_v2: SendHandler = send.send_v2
        pull_handler: PullHandler = pull.pull
        if self.telemetry is not None and self.metrics is not None:
            from data_plane.broker.pull import traced_pull
            from data_plane.broker.send import traced_send

            send_v1 = traced_send(send_v1, self.telemetry, self.metrics)
            send_v2 = traced_send(send_v2, self.telemetry, self.metrics)
            pull_handler = traced_pull(pull_handler, self.telemetry)
        if self.trace is not None:  # off: the pull handler is the plain one
            pull_handler = self.trace.wrap_pull(pull_handler)
        rc = RequestCode
        for code, handler in (
            (rc.SEND_MESSAGE, send_v1),
            (rc.SEND_MESSAGE_V2, send_v2),
            (rc.SEND_BATCH_MESSAGE, send_v2),
            (rc.PULL_MESSAGE, pull_handler),
            (rc.HEART_BEAT, client.heartbeat),
            (rc.UNREGISTER_CLIENT, client.unregister),
            (rc.GET_CONSUMER_LIST_BY_GROUP, client.consumer_list),
            (rc.LOCK_BATCH_MQ, client.lock_batch),
            (rc.UNLOCK_BATCH_MQ, client.unlock_batch),
            (rc.CHECK_CLIENT_CONFIG, client.check_client_config),
            (rc.CONSUMER_SEND_MSG_BACK, SendBackProcessor(self).send_back),
            (rc.END_TRANSACTION, self.transactions.end_transaction),
            (rc.UPDATE_AND_CREATE_TOPIC, admin.create_topic),
            (rc.DELETE_TOPIC_IN_BROKER, admin.delete_topic),
            (rc.GET_ALL_TOPIC_CONFIG, admin.all_topic_config),
            (rc.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, admin.create_group),
            (rc.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, admin.all_groups),
            (rc.DELETE_SUBSCRIPTIONGROUP, admin.delete_group),
            (rc.QUERY_CONSUMER_OFFSET, admin.query_consumer_offset),
            (rc.UPDATE_CONSUMER_OFFSET, admin.update_consumer_offset),
            (rc.GET_MAX_OFFSET, admin.max_offset),
            (rc.GET_MIN_OFFSET, admin.min_offset),
            (rc.SEARCH_OFFSET_BY_TIMESTAMP, admin.search_offset),
            (rc.GET_EARLIEST_MSG_STORETIME, admin.earliest_msg_store_time),
            (rc.VIEW_MESSAGE_BY_ID, admin.view_message_by_id),
            (rc.QUERY_MESSAGE, admin.query_message),
            (rc.GET_BROKER_RUNTIME_INFO, admin.runtime_info),
        ):
            p.register(code, handler)
        # The plain single send, answered straight from its frame (SendProcessor.send_frame),
        # on a broker that can take it that way — ASYNC_FLUSH, not a SYNC_MASTER, the store's
        # appender compiled — where no telemetry or message trace wraps the send handler. Every
        # other request, and every send the frame path leaves, goes through the table.
        if (
            fastpath.COMPILED
            and not self.store.sync_flush
            and self.config.broker_role is not BrokerRole.SYNC_MASTER
            and send_v2 == send.send_v2
            and self.trace is None
        ):
            p.frame_handler = send.send_frame
            self.put_plain = send.put_plain
            self.put_plain_batch = send.put_plain_batch
        if self.tenancy is not None:
            p.register(rc.ORBIT_SYNC_TENANCY, self.tenancy.sync)
        p.register(rc.QUERY_MESSAGE_TRACE, trace.query_handler(self))

    async def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.gc_watch.remove()
        if self.stall_watch is not None:
            self.stall_watch.stop()
        if self.replication is not None:
            # Before the lease timer goes with the failover agent; the unregistration follows.
            self.replication.fence("stopping", reregister=False)
        if self.failover is not None:
            await self.failover.stop()
        await cancel_all(self._tasks)
        self.hold.wake_all()
        if self.config.namesrv_addrs and self.store is not None:
            await self._unregister_all()
        await self.namesrv_client.close()
        if self.grpc is not None:
            await self.grpc.stop()
        await self.server.close()
        if self.replication is not None:
            await self.replication.stop()
        await self.schedule.stop()
        if self.tenancy is not None:
            await self.tenancy.stop()
        if self.store is not None:
            if self.trace is not None:
                self.trace.flush()  # the buffered trace events, before the store closes
            for behind in (self.topics.save_behind, self.groups.save_behind, self._offsets_behind):
                if behind is not None:
                    with contextlib.suppress(OSError):  # (logged; the saves below try again)
                        await behind.saved()
            self.offsets.persist()
            self.topics.persist()
            self.groups.persist()
            await asyncio.to_thread(self.store.shutdown)
        if self._owns_telemetry and self.telemetry is not None:
            await asyncio.to_thread(self.telemetry.shutdown)  # flushes the last spans and metrics
        log.info("broker %s stopped", self.config.broker_name)

    # --- hooks of the processors ----------------------------------------------------------------
    def _topic_written(self, topic: str, write_queue_nums: int) -> None:
        """A topic created or changed here: a master has its new queues made now, off the
        loop thread, rather than on their first sends (a slave's follow the master's log)."""
        if self.is_master:
            self.store.prepare_queues(topic, write_queue_nums)

    def topics_changed(self) -> None:
        """Tell the slaves now and the name servers soon (one registration for a burst of changes)."""
        if self.replication is not None:
            self.replication.metadata_changed()
        if self._register_soon or not self.config.namesrv_addrs:
            return
        self._register_soon = True

        async def later() -> None:
            self._register_soon = False
            await self.register_all()

        task = asyncio.get_running_loop().create_task(later())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def on_stored(self, topic: str, n: int, nbytes: int) -> None:
        s = self.stats
        s["put_msgs"] += n
        s["put_bytes"] += nbytes
        if self.metrics is not None:
            self.metrics.messages_in(None, topic, n, nbytes)

    def on_pulled(self, topic: str, n: int, nbytes: int) -> None:
        s = self.stats
        s["get_msgs"] += n
        s["get_bytes"] += nbytes
        if self.metrics is not None:
            self.metrics.messages_out(None, topic, n, nbytes)
        if self.tenancy is not None:
            self.tenancy.after_pull(topic, n, nbytes)

    def _connection_closed(self, conn: Connection) -> None:
        self.hold.release_owner(conn)  # its held pulls: answered now, for nobody
        if self.tenancy is not None:
            self.tenancy.connection_closed(conn)
        for group in self.clients.connection_closed(conn):
            self.clients.notify_ids_changed(group)

    def runtime_info(self) -> dict[str, str]:
        st = self.store
        info: dict[str, Any] = {
            "brokerName": self.config.broker_name,
            "brokerRole": self.config.broker_role.value,
            "brokerVersionDesc": "Orbit",
            "bootTimestamp": int(self.started_at * 1000),
            "commitLogMinOffset": st.min_phy_offset(),
            "commitLogMaxOffset": st.max_phy_offset(),
            "putMessageTimesTotal": self.stats["put_msgs"],
            "putMessageSizeTotal": self.stats["put_bytes"],
            "getMessageTimesTotal": self.stats["get_msgs"],
            "getMessageSizeTotal": self.stats["get_bytes"],
            "connections": len(self.server.connections),
            # closed by the inbound limits, by reason (remoting/limits.py): "refused.<setting>"
            **{f"refused.{reason}": n for reason, n in self.server.refused.items()},
            "heldPullRequests": self.hold.count,
            "topicCount": len(self.topics.topics),
            "diskFull": st.disk_full,
            **self.loop_stall.runtime_info(),
            "gilSwitchIntervalUs": round(sys.getswitchinterval() * 1e6),
            "answerSlice": self.server.answer_slice,
            "retentionHours": st.retention_hours,
        }
        if st.tier is not None:  # tiered storage (store/tier; docs/tiered_storage.md)
            info.update({f"tier.{k}": v for k, v in st.tier.stats().items()})
            info["messagesFromOffset"] = st.log_floor()
        if self.grpc is not None:  # the RocketMQ 5 endpoint, for orbit proxy (docs/rocketmq5.md)
            info["grpcAddress"] = f"{self.address.rpartition(':')[0]}:{self.grpc.port}"
        info.update(self.idle_queues.runtime_info())  # mappedQueueFiles, idleClosedQueues, openFds
        info.update(self.schedule.runtime_info())
        info.update(self.gc_watch.runtime_info())
        if self.stall_watch is not None:
            info.update(self.stall_watch.runtime_info())
        info["brokerRole"] = self.replication.role.value
        info.update(self.replication.runtime_info())
        if self.failover is not None:
            info.update(self.failover.runtime_info())
        if self.tenancy is not None:  # messages deleted inside retention (forced_deletions.py)
            info.update(self.tenancy.forced_deletions.runtime_info())
        if self.tenancy is not None and self.tenancy.enabled:
            info["authDenied"] = self.tenancy.auth.denied  # refused requests (authorizer and handlers)
        if self.tenancy is not None:
            info["quotaThrottles"] = self.tenancy.throttled  # connections paused for a retry-after
            info["quotaEarlyRefusals"] = self.tenancy.early_refusals  # sends refused off their frames
            info["quotaRefusals"] = self.tenancy.quota_refusals  # publishes refused on the command path
            share = self.tenancy.fair_share  # requests that waited for their tenant's share of the loop
            info["fairShareQueued"] = share.queued if share is not None else 0
            info.update({f"refused.auth.{r}": n for r, n in self.tenancy.refusals.counts.items()})
        return {k: str(v) for k, v in info.items()}

    # --- name servers ---------------------------------------------------------------------------
    def _register_request(self) -> RemotingCommand:
        cfg = self.config
        body = {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": self.topics.topics,
                "dataVersion": self.topics.data_version,
            },
            "filterServerList": [],
        }
        return RemotingCommand(
            RequestCode.REGISTER_BROKER,
            ext_fields={
                "brokerName": cfg.broker_name,
                "brokerAddr": self.address,
                "clusterName": cfg.cluster_name,
                "haServerAddr": self.replication.ha_addr or self.address,
                "brokerId": str(self.replication.registration_id()),
                "compressed": "false",
            },
            body=bodies.dumps(body),
        )

    def _signed(self, cmd: RemotingCommand) -> RemotingCommand:
        if self._namesrv_credential is not None:
            access_key, secret = self._namesrv_credential
            fields = {**(cmd.ext_fields or {}), ACCESS_KEY: access_key}
            fields[SIGNATURE] = sign(fields, cmd.body_bytes(), secret)
            cmd.ext_fields = fields
        return cmd

    async def register_all(self) -> None:
        async def one(addr: str) -> None:
            try:
                r = await self.namesrv_client.invoke(
                    addr, self._signed(self._register_request()), self.config.register_timeout_ms
                )
            except RemotingError as e:
                self._registered.discard(addr)
                log.warning("registering with name server %s failed: %s", addr, e)
                return
            if r.code != ResponseCode.SUCCESS:
                self._registered.discard(addr)
                log.warning("name server %s refused the registration: %s %s", addr, r.code, r.remark)
                return
            self._registered.add(addr)
            ext = r.ext_fields or {}
            if self.replication.follows_namesrv:  # a slave learns its master here (RocketMQ's way)
                self.replication.follow(ext.get("masterAddr", ""), ext.get("haServerAddr", ""))
            elif self.failover is not None and self.failover.out_of_touch and ext.get("haServerAddr"):
                # A fenced master the control plane does not answer: another member registers
                # as master (elected while this one could not hear): follow it, if it proves it.
                await self.replication.follow_without_control_plane(ext.get("masterAddr", ""), ext["haServerAddr"])

        await asyncio.gather(*(one(a) for a in self.config.namesrv_addrs))

    async def _unregister_all(self) -> None:
        cfg = self.config
        for addr in cfg.namesrv_addrs:
            cmd = RemotingCommand(
                RequestCode.UNREGISTER_BROKER,
                ext_fields={
                    "brokerName": cfg.broker_name,
                    "brokerAddr": self.address,
                    "clusterName": cfg.cluster_name,
                    "brokerId": str(self.replication.registration_id()),
                },
            )
            with contextlib.suppress(RemotingError):
                await self.namesrv_client.invoke(addr, self._signed(cmd), 3000)

    # --- periodic work ------------------------------------------------------------------------
    async def _register_loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(self.config.register_interval_s, 1.0))
            # A slave cut off from its master registers every second: the answer names the
            # master's (perhaps new) HA address.
            # So does a broker that some name server has not accepted yet (refused, or down).
            rep = self.replication
            lost = rep.follows_namesrv and not rep.linked
            unregistered = len(self._registered) < len(self.config.namesrv_addrs)
            if lost or unregistered or time.monotonic() - last >= self.config.register_interval_s:
                last = time.monotonic()
                await self.register_all()

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.consumer_offset_persist_interval_s)
            if self.offsets.dirty and self._offsets_behind is not None:
                self._offsets_behind.changed()  # fsyncs off the event loop (persisted.py)
            for behind in (self.topics.save_behind, self.groups.save_behind, self._offsets_behind):
                if behind is not None and behind.dirty:  # a save that failed: again
                    behind.changed()

    def _loop_stalled(self, stall_ms: float) -> None:
        """A stall over ``loop_lag_warn_ms`` (the loop-stall gauge's): logged, unless the stall
        watch reports it (with the loop thread's stack) — always over 100 ms (the watch's thread
        may have been kept from running too, and those are the stalls that count)."""
        if stall_ms > STALL_LIMIT_MS or not (self.stall_watch and self.stall_watch.covers(stall_ms)):
            log.warning(
                "event loop stalled for %.0f ms, its thread on the CPU for %.0f ms of it",
                stall_ms, self.loop_stall.last_cpu_ms,
            )  # fmt: skip

    async def _scan_clients_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.client_scan_interval_s)
            for conn in self.clients.expired_connections():
                log.info("closing %s: no heartbeat for %.0f s", conn.peer, self.config.channel_expired_s)
                conn.close()
                self._connection_closed(conn)


def write_ready_file(path: str, info: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(bodies.dumps(info))
    os.replace(tmp, path)


async def serve(config: BrokerConfig, ready_file: str | None = None) -> int:
    # The store's threads (group commit, flushes) get the GIL within this much of asking.
    sys.setswitchinterval(config.gil_switch_interval_us / 1e6)
    # Every mapped ConsumeQueue and IndexFile file holds a descriptor (open_files.py).
    raise_open_files_limit()
    broker = Broker(config)
    await broker.start()
    # Everything made so far (modules, config, the recovered store) lives as long as the
    # process: out of every later collection (gc_watch.py says why).
    gc.freeze()
    if ready_file:
        write_ready_file(
            ready_file,
            {
                "address": broker.address,
                "pid": os.getpid(),
                "broker_name": config.broker_name,
                "store_dir": config.store_dir,
                **({"grpc_address": f"{broker.address.rpartition(':')[0]}:{broker.grpc.port}"} if broker.grpc else {}),
            },
        )
    print(f"broker {config.broker_name} listening on {broker.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()
    return 0
