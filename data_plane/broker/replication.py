"""Replication: a broker's place in its broker group (docs/ha.md#roles).

    master (SYNC_MASTER / ASYNC_MASTER)            slave (SLAVE)
      HAService on ha_listen ◀──── HA link ────── HAClient → store.append_raw → own dispatcher
        DATA frames of the CommitLog  ─────────▶
        METADATA frames (topics, groups,  ─────▶  apply: topics, groups, offsets, delay progress
          consumer offsets, delay progress)
        ◀─ SLAVE_OFFSETS (offsets clients committed here while the master was away)

The link authenticates both ends with the group's secret (``LinkSecret``, ha_link.py: an
``ha_secret_file``, or with auth on the control plane's) before anything else; only authenticated
slaves count for a SYNC_MASTER. With auth off and no ``ha_secret_file`` it is unauthenticated
(the single-tenant, RocketMQ-compatible mode). A slave's SLAVE_OFFSETS are taken only for
topics, queues and groups the master knows, each at most the queue's max offset here.

A SYNC_MASTER answers a send only once a slave has acknowledged the bytes (``replicated``):
PUT_OK, or FLUSH_SLAVE_TIMEOUT after ``ha_sync_timeout_ms``, or SLAVE_NOT_AVAILABLE at once when
no slave is connected and near enough (RocketMQ's isSlaveOK). Never PUT_OK without a copy.

Roles can change while the broker runs (automatic failover, data_plane/broker/failover.py):
``become_master`` stops the HA client and starts the HA service, the schedule and the
transaction check; ``become_slave`` does the reverse and follows the new master, whose
handshake truncates whatever this log holds that the new master never had. ``writable`` is
what the send path looks at: False on a slave and, with failover on, on a master whose lease
is not (or no longer) confirmed — a fenced old master refuses writes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import ssl
import time
from typing import TYPE_CHECKING, Any

import orjson

from data_plane.broker.config import BrokerRole
from data_plane.broker.consumer_offset import TOPIC_GROUP_SEPARATOR
from data_plane.broker.ha_link import LinkSecret
from data_plane.broker.persisted import ConfigFile
from data_plane.store.ha import HAClient, HAService
from data_plane.store.status import PutMessageStatus
from data_plane.tls import client_context

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.broker.subscription_group import SubscriptionGroupManager
    from data_plane.broker.topic_config import TopicConfigManager

log = logging.getLogger(__name__)

MASTER_ID = 0
# The id a broker configured as master (id 0) registers with while it is a slave after a
# failover; configured slave ids stay below it.
DEMOTED_MASTER_ID = 100
# A group name in a slave's offsets that this master may create (auto_create_subscription_group).
MAX_GROUP_NAME_CHARS = 255
OFFSETS_LOG_INTERVAL_S = 60.0
# A master acknowledging alone waits for a slave again once the slave is this close to its end
# (then sends wait for it; further behind, it catches up while the master goes on alone).
SOLO_REJOIN_GAP_BYTES = 4 * 1024 * 1024
TOP_SAMPLE_S = 0.1  # the log end is sampled for the in-sync set at most this often


def split_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{addr!r} is not host:port")
    return host, int(port)


class Replication:
    def __init__(self, broker: Broker) -> None:
        cfg = broker.config
        self.broker = broker
        self.role = cfg.broker_role
        # The role this broker takes when it is master (a promoted slave takes its group's mode,
        # told by the control plane; SYNC_MASTER unless the group says otherwise).
        self.master_role: BrokerRole = (
            cfg.broker_role if cfg.broker_role is not BrokerRole.SLAVE else BrokerRole.SYNC_MASTER
        )
        self.service: HAService | None = None
        self.client: HAClient | None = None
        self.ha_addr = ""  # a master's published HA address
        self.master_addr = ""  # a slave's master (client address), when known
        self.master_ha_addr = cfg.ha_master_address
        self._state = ConfigFile(os.path.join(cfg.store_dir, "config", "ha.json"))
        doc = self._state.load() or {}
        self.epoch = int(doc.get("epoch", 0))
        # The epoch of the master whose log this broker's log last followed (or wrote, as that
        # master): what an election compares first. A member whose log belongs to an older
        # epoch may hold bytes no later master ever had.
        self.log_epoch = int(doc.get("log_epoch", 0))
        # Following a master learned without the control plane: it must prove an epoch above
        # this one over the (authenticated) link before anything is truncated.
        self._awaiting_epoch: int | None = None
        # The end of the last write answered as acknowledged (a SYNC_MASTER: held by a slave).
        # Slaves holding the log up to here make the in-sync set reported for failover.
        self.acked_end = 0
        # A master's view of its slaves this term: member id → the log it acknowledged; its own
        # log end, sampled each heartbeat; and the in-sync set the control plane last confirmed.
        self._slaves: dict[int, int] = {}
        self._tops: collections.deque[tuple[float, int]] = collections.deque()  # (monotonic, log end)
        self._top_then = 0  # the log end ha_in_sync_timeout_ms ago, as of the last look
        self.confirmed_sync_set: list[int] | None = None
        self.solo_acks = 0
        # With failover: the monotonic time this master's lease ends (its own, conservative
        # copy). No write is answered as acknowledged past it, whatever the fence timer did.
        self.lease_deadline: float | None = None
        # With failover on, nothing is written until the control plane confirms this master.
        self.fenced = cfg.failover_enabled
        self.role_changes = 0
        # Offsets clients committed on this slave: reported to the master until it has them.
        self.local_offsets: dict[str, dict[int, int]] = {}
        self._metadata_applied: bytes | None = None
        self._offsets_timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        # The link's secret, and the connections its authentication refused (by reason; kept
        # across role changes, each of which makes a new HA service).
        self.link = LinkSecret(cfg)
        self.link.load()
        self.link.on_change = self._link_secret_changed
        self.link_refused: collections.Counter[str] = collections.Counter()
        # Entries of slaves' offsets documents not taken (unknown topic, queue or group, a
        # negative offset) and taken only up to the queue's max offset.
        self.slave_offsets_ignored = 0
        self.slave_offsets_clamped = 0
        self._offsets_said_at = -OFFSETS_LOG_INTERVAL_S

    # --- what the rest of the broker looks at ----------------------------------------------------
    @property
    def is_master(self) -> bool:
        return self.role is not BrokerRole.SLAVE

    @property
    def writable(self) -> bool:
        return self.is_master and not self.fenced

    @property
    def follows_namesrv(self) -> bool:
        """A slave that learns its master from the name servers' answers to its registrations
        (neither a fixed ha_master_address nor the control plane's failover)."""
        cfg = self.broker.config
        return not self.is_master and not cfg.failover_enabled and not cfg.ha_master_address

    @property
    def linked(self) -> bool:
        """A slave replicating from its master right now."""
        return self.client is not None and self.client.connected

    @property
    def sync_master(self) -> bool:
        return self.role is BrokerRole.SYNC_MASTER

    def tier_safe_offset(self) -> int:
        """How far the tier may take this master's log (``MessageStore.tier_safe_offset``): bytes
        every member that could be elected holds, so no uploaded record is ever taken back by a
        failover. A SYNC_MASTER: what was acknowledged (held by a slave, or by itself alone once
        the control plane confirmed it the only member in sync). An ASYNC_MASTER: what its
        following slaves hold; everything when none follows. Nothing while not writable. Read
        on the offloader's thread: attributes only."""
        if not self.writable:
            return 0
        service = self.service
        if self.sync_master:
            return max(self.acked_end, service.max_acked_offset if service is not None else -1)
        acked = [c.acked for c in list(service.connections) if c.acked >= 0] if service is not None else []
        return max(acked) if acked else 2**63 - 1

    def registration_id(self) -> int:
        """The broker id registered with name servers: 0 while a master that takes writes; a
        slave's own id otherwise (a master configured as 0 takes DEMOTED_MASTER_ID while it is a
        slave or fenced: it must not push the group's real master out of the routes)."""
        if self.writable:
            return MASTER_ID
        return self.broker.config.broker_id or DEMOTED_MASTER_ID

    def _publish(self) -> None:
        b = self.broker
        b.is_master = self.is_master
        b.writable = self.writable
        if b.store is not None:
            b.store.fenced = not self.writable  # every writer, not only the send path
        if b.transactions is not None:
            b.transactions.is_master = self.writable
        b.offsets.on_local_commit = None if self.is_master else self.on_local_commit
        b.offsets.on_commit = self.offsets_changed if self.is_master else None

    # --- life cycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.is_master:
            await self._start_service()
        else:
            self._start_client()
        self._publish()

    async def stop(self) -> None:
        await self._stop_client()
        await self._stop_service()

    async def _start_service(self) -> None:
        cfg = self.broker.config
        host, port = _ha_listen(cfg.ha_listen, cfg.listen_host, cfg.listen_port, self.broker.server.port)
        self.service = HAService(
            self.broker.store,
            host=host,
            port=port,
            max_gap_not_in_sync_bytes=cfg.ha_max_gap_bytes,
            metadata=self.metadata,
            on_slave_offsets=self.on_slave_offsets,
            auth=self.link.auth(),
            refused=self.link_refused,
            ssl_context=cfg.server_tls.context(),  # the broker's certificate, TLS only, when tls_mode is on
            epoch=self._served_epoch,
        )
        await self.service.start()
        adv = cfg.advertised_host or ("127.0.0.1" if host in ("", "0.0.0.0", "::") else host)
        self.ha_addr = cfg.ha_advertised or f"{adv}:{self.service.port}"

    async def _stop_service(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None
            self.ha_addr = ""

    def _start_client(self) -> None:
        if not self.master_ha_addr:
            log.info("slave: waiting to learn the master's HA address (name server or control plane)")
            return
        host, port = split_address(self.master_ha_addr)
        self.client = HAClient(
            self.broker.store, host, port, on_metadata=self.on_metadata, offsets_to_report=self.offsets_to_report,
            auth=self.link.auth(),
            ssl_context=self._ha_client_tls(),
            member_id=self.broker.config.broker_id,
            min_master_epoch=self._least_master_epoch,
            on_master_epoch=self._on_master_epoch,
        )  # fmt: skip
        self.client.start()

    def _served_epoch(self) -> int:
        """The epoch a master tells slaves in the handshake: its log's, while it takes writes;
        -1 while fenced (a slave then refuses it: a fenced master's log may lag the group's, and
        must not make a slave truncate)."""
        return self.log_epoch if self.writable else -1

    def _least_master_epoch(self) -> int:
        return self._awaiting_epoch if self._awaiting_epoch is not None else self.epoch

    def _on_master_epoch(self, epoch: int) -> None:
        """A master's stream started: this log is now a prefix of that epoch's log."""
        if self._awaiting_epoch is not None:
            log.warning("the master at %s proved epoch %d: following it", self.master_ha_addr, epoch)
            self._awaiting_epoch = None
        self.epoch = max(self.epoch, epoch)
        self.log_epoch = epoch
        self._save_state()

    def _ha_client_tls(self) -> ssl.SSLContext | None:
        """TLS to the master's HA port when this group's brokers serve TLS (tls_mode), verified
        by tls_ca_file (BrokerConfig requires it then)."""
        cfg = self.broker.config
        if cfg.tls_mode == "disabled":
            return None
        return client_context(ca_file=cfg.tls_ca_file or None)

    def _link_secret_changed(self) -> None:
        """A slave waiting for the link's secret connects at once."""
        if self.client is not None:
            self.client.wake()

    async def _stop_client(self) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None

    def follow(self, master_addr: str, master_ha_addr: str) -> bool:
        """A slave learns (or re-learns) its master: from the name server's answer to its
        registration, or from the control plane. True when it now follows another master."""
        if master_addr:
            self.master_addr = master_addr
        if not master_ha_addr or self.is_master or (master_ha_addr == self.master_ha_addr and self.client):
            return False
        try:
            split_address(master_ha_addr)
        except ValueError:
            log.warning("ignoring master HA address %r", master_ha_addr)
            return False
        log.info("slave: following master HA %s (was %s)", master_ha_addr, self.master_ha_addr or "none")
        self.master_ha_addr = master_ha_addr
        if self.client is not None:
            host, port = split_address(master_ha_addr)
            self.client.update_master_address(host, port)
            self.client.reconnect()
        else:
            self._start_client()
        return True

    # --- role changes (failover) --------------------------------------------------------------------
    def save_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._save_state()

    def _save_state(self) -> None:
        self._state.save({"epoch": self.epoch, "log_epoch": self.log_epoch})

    def in_lease(self) -> bool:
        return self.lease_deadline is None or time.monotonic() < self.lease_deadline

    async def become_master(self, epoch: int, role: BrokerRole, *, lease_deadline: float | None = None) -> None:
        """Master under ``epoch`` (with failover, until ``lease_deadline``): confirmed, or
        promoted from slave. A lease that ran out meanwhile (the lock, a slow promotion) leaves
        it fenced."""
        async with self._lock:
            if lease_deadline is not None:
                self.lease_deadline = lease_deadline
            self.save_epoch(epoch)
            self.master_role = role
            if self.is_master:
                was_fenced = self.fenced
                self.role = role
                if not self.in_lease():
                    return
                self.fenced = False
                if was_fenced:
                    self._take_epoch(epoch)
                self._publish()
                if was_fenced:  # confirmed (at start, or after a lapse): serve as master again
                    log.info("master of %s confirmed (epoch %d)", self.broker.config.broker_name, epoch)
                    await self.broker.on_became_master()
                return
            log.warning("promoted to %s of %s (epoch %d)", role.value, self.broker.config.broker_name, epoch)
            await self._stop_client()
            # A master that died mid-chunk left a partial record: new records must not follow it.
            # (Off the loop: the cut's wipe, the index flush and the queues' offsets; nothing
            # appends meanwhile — the store is fenced and the HA client stopped.)
            end = await asyncio.to_thread(self.broker.store.cut_partial_tail)
            try:
                await self._start_service()
            except OSError as e:  # stay a fenced slave; the next answer tries again
                log.error("promotion failed, staying a slave: %s", e)
                self._start_client()
                return
            log.info("promoted at CommitLog offset %d", end)
            # Offsets clients committed here while the old master was away are simply ours now.
            self.local_offsets.clear()
            self.role = role
            self.fenced = not self.in_lease()
            self._awaiting_epoch = None
            self._take_epoch(epoch)
            self.master_addr = ""
            self.role_changes += 1
            self._publish()
            await self.broker.on_became_master()

    def _take_epoch(self, epoch: int) -> None:
        """Writable under ``epoch``: its log is that epoch's log from here on; everything it
        holds may have been acknowledged by an earlier master."""
        if self.log_epoch != epoch:
            self.log_epoch = epoch
            self._save_state()
        self.acked_end = max(self.acked_end, self.broker.store.max_phy_offset())
        self._slaves.clear()
        self._tops.clear()
        self._top_then = 0
        self.confirmed_sync_set = None

    def in_sync(self) -> list[int] | None:
        """A master's in-sync set (failover): the member ids of its slaves that hold every
        acknowledged message. A SYNC_MASTER keeps a slave that went away in the set while it
        acknowledges nothing without it — with ``ha_min_in_sync`` 2 always; with 1 while the slave
        holds what this master had ``ha_in_sync_timeout_ms`` ago (then it reports it out, to be
        allowed to acknowledge alone).
        An ASYNC_MASTER acknowledges without slaves: its slaves within ``ha_max_gap_bytes``.
        None for a slave."""
        service = self.service
        if service is None or not self.is_master:
            return None
        if not self.sync_master:
            top = self.broker.store.max_phy_offset()
            return service.in_sync(max(0, top - self.broker.config.ha_max_gap_bytes))
        for c in service.connections:
            if c.member_id is not None and c.acked >= 0:  # what its current connection acknowledged
                self._slaves[c.member_id] = c.acked
        cfg = self.broker.config
        if cfg.ha_min_in_sync >= 2:
            return sorted(m for m, acked in self._slaves.items() if acked >= self.acked_end)
        # Keeping up: it holds what this master had ha_in_sync_timeout_ms ago (RocketMQ's
        # haMaxTimeSlaveNotCatchup), connected or not.
        now = time.monotonic()
        tops = self._tops
        if not tops or now - tops[-1][0] >= TOP_SAMPLE_S:
            tops.append((now, self.broker.store.max_phy_offset()))
        horizon = now - cfg.ha_in_sync_timeout_ms / 1000
        while len(tops) > 1 and tops[1][0] <= horizon:
            tops.popleft()
        then = self._top_then = tops[0][1] if tops[0][0] <= horizon else 0
        return sorted(m for m, acked in self._slaves.items() if acked >= self.acked_end and acked >= then)

    @property
    def solo(self) -> bool:
        """A SYNC_MASTER that acknowledges alone: ``ha_min_in_sync`` 1, the control plane
        confirmed it the only member of the in-sync set, and no slave keeps up: one that holds
        what the master had ``ha_in_sync_timeout_ms`` ago and is within 4 MiB of its end ends it
        at once (sends wait for it again), before it is reported in sync again."""
        if self.broker.config.ha_min_in_sync >= 2 or self.confirmed_sync_set is None or self.service is None:
            return False
        if self.confirmed_sync_set != [self.broker.config.broker_id]:
            return False
        near = max(self._top_then, self.broker.store.max_phy_offset() - SOLO_REJOIN_GAP_BYTES)
        if any(c.acked >= near for c in self.service.connections):
            # Until the control plane confirms it alone again (an answer to a heartbeat that
            # reported no slave in sync), whatever that slave does next.
            self.confirmed_sync_set = None
            return False
        return True

    async def become_slave(self, epoch: int, master_addr: str, master_ha_addr: str) -> bool:
        """True when something changed (demoted, or following another master)."""
        async with self._lock:
            self.save_epoch(epoch)
            self._awaiting_epoch = None
            if not self.is_master:
                return self.follow(master_addr, master_ha_addr)
            log.warning(
                "demoted to slave of %s (epoch %d, master %s)", self.broker.config.broker_name, epoch, master_addr
            )
            await self._demote(master_addr, master_ha_addr)
            return True

    async def follow_without_control_plane(self, master_addr: str, master_ha_addr: str) -> bool:
        """A fenced master cut off from the control plane learned (from the name servers) that
        another member registers as the group's master: demote itself and follow it — but only
        once that master proves, over the authenticated link, an epoch above this one (the
        handshake is refused before any truncation otherwise). True when it now follows."""
        async with self._lock:
            if not self.is_master or not self.fenced or not master_ha_addr or master_ha_addr == self.ha_addr:
                return False
            log.warning(
                "no answer from the control plane; the name servers name %s (HA %s) master of %s: following it "
                "once it proves an epoch above %d", master_addr, master_ha_addr, self.broker.config.broker_name,
                self.epoch,
            )  # fmt: skip
            self._awaiting_epoch = self.epoch + 1
            await self._demote(master_addr, master_ha_addr)
            return True

    async def _demote(self, master_addr: str, master_ha_addr: str) -> None:
        """Master → slave of ``master_ha_addr``: fenced, master-only services stopped."""
        self.role = BrokerRole.SLAVE
        self.fenced = True
        self._publish()
        await self.broker.on_became_slave()
        await self._stop_service()
        self._forget_timer_progress()
        self.role_changes += 1
        self.master_ha_addr = ""
        self.follow(master_addr, master_ha_addr)

    def fence(self, why: str, *, reregister: bool = True) -> None:
        """Stop taking writes now (a master whose lease lapsed, or one shutting down)."""
        if not self.fenced:
            # A lapsed lease is an incident; a shutdown (no re-registration) is routine.
            log.log(logging.ERROR if reregister else logging.INFO, "writes fenced: %s", why)
            self.fenced = True
            self._publish()
            if reregister:
                self.broker.topics_changed()  # no longer the group's id 0

    def _forget_timer_progress(self) -> None:
        """The timer log of a former master describes its own log, which the new master's
        handshake may truncate: drop it; a promotion rebuilds it from the timer topic."""
        cfg = self.broker.config
        checkpoint = os.path.join(cfg.store_dir, "config", "timerCheckpoint.json")
        for path in (checkpoint, checkpoint + ".bak"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        shutil.rmtree(os.path.join(cfg.store_dir, "timerlog"), ignore_errors=True)

    # --- sync double write ----------------------------------------------------------------------------
    async def replicated(self, end_offset: int) -> PutMessageStatus:
        """SYNC_MASTER: PUT_OK once a slave holds the log up to ``end_offset``."""
        service = self.service
        if service is not None and self.solo and self.writable and self.in_lease():
            self.acked_end = max(self.acked_end, end_offset)
            self.solo_acks += 1
            self.notify()
            return PutMessageStatus.PUT_OK
        if service is None or not service.is_slave_ok(end_offset):
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        if not await service.wait_for_slave(end_offset, self.broker.config.ha_sync_timeout_ms):
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        if not (self.writable and self.in_lease()):
            # Fenced (or past its lease) while it waited: another member may be master now, and
            # may lack these bytes. Stored, not acknowledged.
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        self.acked_end = max(self.acked_end, end_offset)
        return PutMessageStatus.PUT_OK

    async def acknowledged(self, end_offset: int) -> PutMessageStatus:
        """What a write of the broker's own up to ``end_offset`` (a lease, a recall) may be
        answered with: on a SYNC_MASTER once a slave holds it, else at once (slaves are told)."""
        if self.sync_master:
            return await self.replicated(end_offset)
        self.notify()
        return PutMessageStatus.PUT_OK

    def suggest_broker_id(self, far_behind: bool) -> str:
        """Where a consumer should pull next (seed 7.15): a master sends readers of data no
        longer in memory to a slave; a slave sends readers back once they read hot data and
        the master is reachable, else keeps them."""
        if self.is_master:
            service = self.service
            if far_behind and service is not None and service.connections and self.broker.config.slave_read_enable:
                return "1"
            return "0"
        client = self.client
        if not far_behind and client is not None and client.connected:
            return "0"
        return str(self.registration_id())

    def metadata_changed(self) -> None:
        if self.service is not None:
            self.service.metadata_changed()

    def offsets_changed(self) -> None:
        """A commit on the master: slaves get the offsets within ~50 ms (one push for a burst),
        so a promoted slave starts from offsets at most that old."""
        if self._offsets_timer is None and self.service is not None and self.service.connections:
            self._offsets_timer = asyncio.get_running_loop().call_later(0.05, self._push_offsets)

    def _push_offsets(self) -> None:
        self._offsets_timer = None
        self.metadata_changed()

    def adopt_stored_topics(self) -> list[str]:
        """A new master: topics whose messages it holds but whose config never reached it (the
        old master died within a moment of creating them) get a config from their queues."""
        topics = self.broker.topics
        queue_ids: dict[str, int] = {}
        for topic, qid in list(self.broker.store.queues.queues):
            queue_ids[topic] = max(queue_ids.get(topic, 0), qid + 1)
        adopted = []
        for topic, n in queue_ids.items():
            if topics.get(topic) is None:
                try:
                    topics.create_or_update(topic, read_queue_nums=n, write_queue_nums=n)
                except ValueError as e:
                    log.warning("cannot adopt stored topic %s: %s", topic, e)
                    continue
                adopted.append(topic)
        if adopted:
            log.warning("adopted %d topics known only from their stored messages: %s", len(adopted), adopted[:10])
        return adopted

    def notify(self) -> None:
        if self.service is not None:
            self.service.notify()

    # --- metadata: master → slave --------------------------------------------------------------------
    def metadata(self) -> bytes | None:
        b = self.broker
        doc: dict[str, Any] = {
            "epoch": self.epoch,
            "topicConfigTable": b.topics.topics,
            "subscriptionGroupTable": b.groups.groups,
            "offsetTable": b.offsets.table,
        }
        if b.schedule.levels is not None:
            delay_doc, _timer_doc, _end = b.schedule.snapshot()
            doc["delayOffset"] = delay_doc
        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)

    def on_metadata(self, raw: bytes) -> None:
        if raw == self._metadata_applied or self.is_master:
            return
        try:
            doc = orjson.loads(raw)
            self._apply(doc)
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
            log.error("ignoring the master's metadata: %s", e)
            return
        self._metadata_applied = raw

    def _apply(self, doc: dict[str, Any]) -> None:
        b = self.broker
        topics = doc.get("topicConfigTable")
        if isinstance(topics, dict) and topics != b.topics.topics:
            for name, tc in topics.items():
                b.topics.topics[str(name)] = tc
            for name in [n for n in b.topics.topics if n not in topics]:
                del b.topics.topics[name]
            # Saved behind (a worker thread's fsync, not the loop's): the master sends it again.
            _save_behind(b.topics)
            b.topics_changed()
        groups = doc.get("subscriptionGroupTable")
        if isinstance(groups, dict) and groups != b.groups.groups:
            b.groups.groups = {str(k): v for k, v in groups.items() if isinstance(v, dict)}
            _save_behind(b.groups)
        offsets = doc.get("offsetTable")
        if isinstance(offsets, dict):
            self._merge_offsets(offsets)
        delay = doc.get("delayOffset")
        if isinstance(delay, dict):
            b.schedule.save_delay_progress(delay)

    def _merge_offsets(self, master: dict[str, Any]) -> None:
        """The master's table, except where a client committed further here (kept, and sent
        back until the master has it)."""
        table: dict[str, dict[int, int]] = {}
        for key, queues in master.items():
            if isinstance(queues, dict):
                table[str(key)] = {int(q): int(o) for q, o in queues.items()}
        local = self.local_offsets
        for key in list(local):
            mine = local[key]
            theirs = table.setdefault(key, {})
            for q in list(mine):
                if theirs.get(q, -1) >= mine[q]:
                    del mine[q]  # the master has it
                else:
                    theirs[q] = mine[q]
            if not mine:
                del local[key]
        offsets = self.broker.offsets
        if table != offsets.table:
            offsets.table = table
            offsets.dirty = True

    def on_local_commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A client committed an offset on this slave."""
        if not self.is_master:
            self.local_offsets.setdefault(topic + TOPIC_GROUP_SEPARATOR + group, {})[queue_id] = offset

    # --- offsets: slave → master ----------------------------------------------------------------------
    def offsets_to_report(self) -> bytes | None:
        if not self.local_offsets:
            return None
        return orjson.dumps({"offsetTable": self.local_offsets}, option=orjson.OPT_NON_STR_KEYS)

    def on_slave_offsets(self, raw: bytes) -> None:
        """Offsets committed on a slave while this master was away (only an authenticated slave
        reaches here): taken where they are ahead, for topics, queue ids and groups this master
        knows, each at most the queue's max offset here — the slave's queues are copies of these,
        so a larger offset is wrong, not ahead. Everything else is ignored, counted and logged."""
        try:
            table = orjson.loads(raw)["offsetTable"]
            if not isinstance(table, dict):
                raise TypeError("offsetTable is not an object")
        except (orjson.JSONDecodeError, TypeError, KeyError) as e:
            self.slave_offsets_ignored += 1
            log.error("ignoring a slave's offsets: %s", e)
            return
        ignored, clamped = self.apply_slave_offsets(table)
        if ignored or clamped:
            self.slave_offsets_ignored += ignored
            self.slave_offsets_clamped += clamped
            now = time.monotonic()
            if now - self._offsets_said_at >= OFFSETS_LOG_INTERVAL_S:
                self._offsets_said_at = now
                log.warning(
                    "a slave's offsets: %d entries ignored (unknown topic, queue or group, or negative), "
                    "%d lowered to the queue's max offset (totals %d, %d; logged at most every %.0f s)",
                    ignored, clamped, self.slave_offsets_ignored, self.slave_offsets_clamped,
                    OFFSETS_LOG_INTERVAL_S,
                )  # fmt: skip

    def apply_slave_offsets(self, table: dict[str, Any]) -> tuple[int, int]:
        """``on_slave_offsets``'s rule on a decoded ``offsetTable``: (entries ignored, entries
        lowered to the queue's max offset)."""
        b = self.broker
        offsets = b.offsets
        ignored = clamped = 0
        for key, queues in table.items():
            topic, sep, group = str(key).partition(TOPIC_GROUP_SEPARATOR)
            tc = b.topics.get(topic) if sep else None
            if not isinstance(queues, dict):
                ignored += 1
                continue
            if tc is None or not self._knows_group(group, key):
                ignored += len(queues)
                continue
            nqueues = max(_int(tc.get("readQueueNums")), _int(tc.get("writeQueueNums")))
            for q_raw, o_raw in queues.items():
                q, o = _int(q_raw, -1), _int(o_raw, -1)
                if not 0 <= q < nqueues or o < 0:
                    ignored += 1
                    continue
                top = b.store.max_offset_in_queue(topic, q)
                if o > top:
                    o = top
                    clamped += 1
                if o > offsets.query(group, topic, q):
                    offsets.commit(group, topic, q, o)
        return ignored, clamped

    def _knows_group(self, group: str, key: str) -> bool:
        """A subscription group of this master, one it holds offsets of, or — where groups are
        created on first use (auto_create_subscription_group, auth off) — any plausible name."""
        b = self.broker
        if group in b.groups.groups or key in b.offsets.table:
            return True
        return b.groups.auto_create and 0 < len(group) <= MAX_GROUP_NAME_CHARS

    # --- figures ----------------------------------------------------------------------------------------
    def lag(self) -> tuple[int, float] | None:
        """(bytes, seconds) behind: of the slave furthest behind on a master, of this slave on a
        slave (seconds unknown there: -1); None when there is nothing to say."""
        if self.service is not None:
            lags = self.service.lag()
            if not lags:
                return None
            worst = max(lags, key=lambda s: s.lag_bytes)
            return worst.lag_bytes, worst.lag_seconds
        c = self.client
        if c is not None and c.connected:
            return max(0, c.master_max_offset - self.broker.store.max_phy_offset()), -1.0
        return None

    def runtime_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "haEpoch": self.epoch,
            "haLogEpoch": self.log_epoch,
            "haFenced": self.fenced,
            "haRoleChanges": self.role_changes,
        }
        if (in_sync := self.in_sync()) is not None:
            info["haInSync"] = ",".join(map(str, in_sync))
            info["haSolo"] = self.solo
            info["haSoloAcks"] = self.solo_acks
        # How the link authenticates ("off", "ha_secret_file", "control plane", or waiting), and
        # what it refused: connections by reason ("haLinkRefused.<reason>"), offsets entries.
        info["haLinkAuth"] = self.link.status()
        info["haLinkRefused"] = sum(self.link_refused.values())
        info.update({f"haLinkRefused.{reason}": n for reason, n in self.link_refused.items()})
        info["haSlaveOffsetsIgnored"] = self.slave_offsets_ignored
        info["haSlaveOffsetsClamped"] = self.slave_offsets_clamped
        if self.service is not None:
            lags = self.service.lag()
            info["haServerAddr"] = self.ha_addr
            info["haSlaves"] = len(lags)
            info["haLagBytes"] = max((lag.lag_bytes for lag in lags), default=-1)
            secs = [lag.lag_seconds for lag in lags if lag.lag_seconds == lag.lag_seconds]
            info["haLagSeconds"] = round(max(secs), 3) if secs else -1
        if self.client is not None:
            c = self.client
            info["haMasterAddr"] = self.master_ha_addr
            info["haConnected"] = c.connected
            info["haMasterMaxOffset"] = c.master_max_offset
            info["haLagBytes"] = max(0, c.master_max_offset - self.broker.store.max_phy_offset()) if c.connected else -1
            info["haBytesReceived"] = c.bytes_received
            info["haTruncations"] = c.truncations  # handshakes that cut this log back to the master's
            info["haLinkAuthFailures"] = c.auth_failures
            info["haMasterEpoch"] = c.master_epoch
            info["haStaleMasters"] = c.stale_masters
        return info


def _save_behind(table: TopicConfigManager | SubscriptionGroupManager) -> None:
    if table.save_behind is not None:
        table.save_behind.changed()
    else:
        table.persist()


def _int(value: Any, default: int = 0) -> int:
    """A whole number from a JSON document, else ``default`` (a bool is not one)."""
    if isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _ha_listen(setting: str, listen_host: str, configured_port: int, bound_port: int) -> tuple[str, int]:
    """ha_listen, else the listen host and listen port + 1 (10912 beside 10911); a broker
    listening on port 0 (any free port) takes any free HA port too."""
    if not setting:
        return listen_host or "0.0.0.0", bound_port + 1 if configured_port else 0
    host, port = split_address(setting)
    return host or "0.0.0.0", port
