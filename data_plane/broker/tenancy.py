"""BrokerTenancy: identity, authorization, quotas and metering on the broker's request paths.

    every request ─▶ before(): Authorizer.check ─▶ tenant suspended? ─▶ meter the request ─▶ handler
    send          ─▶ before_put(): the tenant's publish bucket ─▶ FLOW_CONTROL (215, retry-after-ms) or store
                     ─▶ after_put(): count the messages stored
    pull          ─▶ before_pull(): is the tenant's consume bucket in debt? ─▶ serve ─▶ after_pull(): charge it
    ORBIT_SYNC_TENANCY (9001, operators only) ─▶ credentials, tenant status and quota shares, kept on disk

Nothing here calls the control plane on a request path: tokens are verified against the cached
JWKS, access keys against the last credential snapshot, quotas against the last shares — all
kept under ``<store_dir>/config`` so a restarted broker serves with them while the control plane
is down. Usage is counted per tenant and minute into a spool (``<store_dir>/usage``) that a
reporter sends to the control plane when it can. Every request refused because its tenant is over
a quota or limit (publish and consume quotas, storage shares, connections, requests in flight) is
counted once as the tenant's ``throttled_requests``.

A resource's tenant is its namespace (``tenant%name``); after authorization it is also the
principal's (operators may touch any tenant's resources; their requests are metered to the
resource's tenant).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import tomllib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import orjson

from data_plane.auth import UNCHECKED, AuthConfig, AuthError, Authorizer, CredentialEntry, Denial, Principal
from data_plane.broker.forced_deletions import ForcedDeletions
from data_plane.broker.ha_link import decode_ha_secret
from data_plane.broker.persisted import ConfigFile
from data_plane.broker.tenant_storage import TenantBytes, measure
from data_plane.broker.transaction import PROPERTY_PRODUCER_GROUP, is_transactional
from data_plane.refusal_log import RefusalLog
from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import Body, RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.fair_share import FairShare
from data_plane.remoting.send_frame import flow_control_frame, send_fields
from data_plane.store.message import Message, RecordError, parse_record
from data_plane.tasks import cancel_all
from data_plane.tenancy.load_report import LoadReports
from data_plane.tenancy.load_reporter import LoadReporter
from data_plane.tenancy.metering import UsageMeter
from data_plane.tenancy.namespace import parse_wire_name, tenant_of
from data_plane.tenancy.quota import Limits, QuotaManager, flow_control_remark, parse_retry_after_ms
from data_plane.tenancy.usage_reporter import UsageReporter
from data_plane.tenancy.usage_spool import UsageSpool
from data_plane.tenancy.usage_topic import UsageTopic

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from sdk.credentials import ClientCredentials

log = logging.getLogger(__name__)

_STATUSES = ("active", "suspended")
# Denials that failed authentication (who is asking), as against authorization (what they may do).
_AUTHENTICATION_REMARKS = re.compile(r"no credentials|token|signature|access key|Authorization|credential", re.I)
MAX_RETENTION_HOURS = 100_000  # a topic's total retention (the control plane gives at most 8760, or null)
MAX_LOCAL_RETENTION_HOURS = 8760  # a topic's local retention


class TenantState(TypedDict, total=False):
    id: str
    status: str  # "active" | "suspended"
    limits: dict[str, float | None] | None  # this broker's share; None = no limit
    storage_bytes: int | None  # this broker's share of the tenant's storage quota (its disk); None = no limit
    max_tiered_bytes: int | None  # its share of the tenant's quota in object storage; None = no limit
    max_connections: int  # connections the tenant may hold to this broker (0: no limit)
    max_inflight_requests: int  # its requests in flight here, over all its connections (0: no limit)


class TenancySnapshot(TypedDict):
    """The body of ORBIT_SYNC_TENANCY (JSON): everything tenancy the control plane decides."""

    version: int
    credentials: list[CredentialEntry]
    tenants: list[TenantState]
    # The total retention each tenant topic was promised, on disk and in object storage (None: unlimited).
    topic_retention_hours: dict[str, float | None]
    # How long each topic that asked keeps its messages on the local disk too (the others: the store's
    # local_retention_hours). Absent from the snapshots of control planes before tiered storage.
    topic_local_retention_hours: dict[str, float]
    # Base64 of the broker group's HA link secret (data_plane/broker/ha_link.py); kept sealed
    # there, never in this snapshot's state file.
    ha_secret: NotRequired[str]


class TenancyError(ValueError):
    """A snapshot that cannot be applied; the message says why."""


def _hours(value: object, most: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= most


def _retention_maps(doc: dict[str, Any]) -> tuple[dict[str, float | None], dict[str, float]]:
    """``topic_retention_hours`` (null: unlimited) and ``topic_local_retention_hours``."""
    total = doc.get("topic_retention_hours", {})
    if not isinstance(total, dict) or not all(
        isinstance(k, str) and (v is None or _hours(v, MAX_RETENTION_HOURS)) for k, v in total.items()
    ):
        raise TenancyError(
            f"topic_retention_hours must map topic names to hours (0 < h <= {MAX_RETENTION_HOURS}) or null (unlimited)"
        )
    local = doc.get("topic_local_retention_hours", {})
    if not isinstance(local, dict) or not all(
        isinstance(k, str) and _hours(v, MAX_LOCAL_RETENTION_HOURS) for k, v in local.items()
    ):
        raise TenancyError(
            f"topic_local_retention_hours must map topic names to hours (0 < h <= {MAX_LOCAL_RETENTION_HOURS})"
        )
    return total, local


def parse_snapshot(body: bytes) -> TenancySnapshot:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise TenancyError(f"tenancy snapshot is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise TenancyError("tenancy snapshot must be a JSON object")
    version = doc.get("version")
    creds = doc.get("credentials", [])
    tenants = doc.get("tenants", [])
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise TenancyError("tenancy snapshot needs a non-negative integer version")
    if not isinstance(creds, list) or not isinstance(tenants, list):
        raise TenancyError("credentials and tenants must be lists")
    retention, local_retention = _retention_maps(doc)
    for t in tenants:
        if not isinstance(t, dict) or not isinstance(t.get("id"), str) or t.get("status") not in _STATUSES:
            raise TenancyError(f"bad tenant entry {str(t)[:80]!r}: needs id and status active|suspended")
        for name in ("storage_bytes", "max_tiered_bytes"):
            v = t.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise TenancyError(f"tenant {t['id']}: {name} must be a non-negative integer or null")
        for name in ("max_connections", "max_inflight_requests"):
            v = t.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 2**31 - 1):
                raise TenancyError(f"tenant {t['id']}: {name} must be an integer 0..2147483647 or absent")
        limits = t.get("limits")
        if limits is not None:
            if not isinstance(limits, dict):
                raise TenancyError(f"tenant {t['id']}: limits must be an object or null")
            try:
                Limits.from_dict(limits)
            except (TypeError, ValueError) as e:
                raise TenancyError(f"tenant {t['id']}: {e}") from None
    snap: TenancySnapshot = {
        "version": version, "credentials": creds, "tenants": tenants, "topic_retention_hours": retention,
        "topic_local_retention_hours": local_retention,
    }  # fmt: skip
    if (ha_secret := doc.get("ha_secret")) is not None:
        try:
            decode_ha_secret(ha_secret)
        except ValueError as e:
            raise TenancyError(str(e)) from None
        snap["ha_secret"] = ha_secret
    return snap


def load_broker_credentials(path: str) -> tuple[str, str]:
    """(access_key, secret) from a TOML or JSON file; the secret is never logged."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        doc: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            doc = tomllib.loads(raw.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path} is neither JSON nor TOML") from None
    ak, secret = doc.get("access_key"), doc.get("secret")
    if not isinstance(ak, str) or not isinstance(secret, str) or not ak or not secret:
        raise ValueError(f"{path} must hold access_key and secret")
    return ak, secret


class BrokerTenancy:
    def __init__(self, broker: Broker) -> None:
        cfg = broker.config
        self.broker = broker
        self.enabled = cfg.auth_enabled
        conf_dir = os.path.join(cfg.store_dir, "config")
        self.auth = Authorizer.from_config(
            AuthConfig.for_store_dir(
                cfg.store_dir,
                enabled=cfg.auth_enabled,
                jwks_url=cfg.effective_jwks_url if cfg.auth_enabled else "",
                jwks_refresh_interval_s=cfg.jwks_refresh_interval_s,
                # END_TRANSACTION / VIEW_MESSAGE_BY_ID name only an offset: their handlers check the
                # stored message's topic with allows_stored_topic (docs/auth.md).
                deferred_checks=True,
            ).validate()
        )
        # Staggered refusals: a tenant with many concurrent senders over its quota is told to come
        # back one slot after another, not all at once (refused requests cost CPU too).
        self.quotas = QuotaManager(burst_s=cfg.quota_burst_s, stagger_refusals=True)
        self.suspended: frozenset[str] = frozenset()
        self.storage_limits: dict[str, int] = {}  # tenant -> its share on this broker's disk
        self.tiered_limits: dict[str, int] = {}  # tenant -> its share in object storage
        self.stored: dict[str, int] = {}  # tenant -> bytes on this broker's disk, last measured
        self.tiered: dict[str, int] = {}  # tenant -> bytes in object storage only, last measured
        self.over_storage: frozenset[str] = frozenset()
        self.version = 0
        self._state_file = ConfigFile(os.path.join(conf_dir, "tenants.json"))
        self.spool = UsageSpool(os.path.join(cfg.store_dir, "usage"))
        # The usage topic (masters only): records also go to ORBIT_SYS_USAGE for the Spark pipeline.
        self.usage_topic = UsageTopic(broker.store) if cfg.usage_topic_enabled and cfg.is_master else None
        # Every refusal: one log line with the source address (rate-limited per reason), counted by
        # reason (runtime info "refused.auth.<reason>", the orbit.broker.auth.refused metric).
        self.refusals = RefusalLog(log, "requests refused")
        self.throttled = 0  # connections paused for their tenant's retry-after (throttle)
        self.early_refusals = 0  # sends refused off their frames (refuse_send_early)
        self.quota_refusals = 0  # sends and batches refused for the publish quota on the command path
        # Per tenant topic, its sends and pulls refused (quota, suspended, over storage) not yet in a load report.
        self.refused_topics: Counter[str] = Counter()
        self.load_reporter: LoadReporter | None = None
        self.meter = UsageMeter(
            cfg.broker_name,
            spool=self.spool,
            period_ms=round(cfg.usage_roll_interval_s * 1000),
            publish=self.usage_topic.publish if self.usage_topic is not None else None,
        )
        # Messages the store deleted inside retention (the disk's emergency watermark), per tenant;
        # each tenant's share also goes into its usage records.
        self.forced_deletions = ForcedDeletions(report=self.meter.record_forced_deletion)
        if broker.store is not None:
            broker.store.on_forced_deletion = self.forced_deletions
        self.reporter: UsageReporter | None = None
        self._token_source: ClientCredentials | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.max_connections = cfg.max_connections_per_tenant
        self.connections: dict[str, int] = {}  # tenant -> connections counted for it
        # Per tenant, its plan's limits here (else the broker's max_connections_per_tenant, and no
        # in-flight limit), and the requests in flight over its connections: [count, limit], a
        # cell each of its connections shares (Connection.tenant_load).
        self.tenant_max_connections: dict[str, int] = {}
        self.tenant_load: dict[str, list[int]] = {}
        self.tenant_inflight_limits: dict[str, int] = {}
        self.fair_share: FairShare | None = None  # made in start (it needs the loop)

    @property
    def token_source(self) -> ClientCredentials | None:
        """The broker's own credential for the control plane (usage reports, failover leases)."""
        return self._token_source

    # --- life cycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        doc = self._state_file.load()
        if doc is not None:
            try:
                self._apply_tenants(parse_snapshot(orjson.dumps({**doc, "credentials": []})))
            except TenancyError as e:
                log.error("ignoring %s: %s", self._state_file.path, e)
        await self.auth.start()
        if self.usage_topic is not None:
            self.usage_topic.ensure_topic(self.broker.topics)
        cfg = self.broker.config
        if cfg.control_plane_url and cfg.broker_credentials_file:
            from sdk.credentials import ClientCredentials

            ak, secret = load_broker_credentials(cfg.broker_credentials_file)
            self._token_source = ClientCredentials(ak, secret, cfg.control_plane_url.rstrip("/") + "/oauth/token")
            self.reporter = UsageReporter(
                self.spool,
                control_plane_url=cfg.control_plane_url,
                token=self._token_source.token,
                idle_interval_s=cfg.usage_report_interval_s,
                backoff_max_s=max(1.0, cfg.usage_report_interval_s),
            )
            self.reporter.start()
            self.load_reporter = self._load_reporter(self._token_source)
        loop = asyncio.get_running_loop()
        if cfg.fair_share:
            self.fair_share = FairShare(
                loop, quantum_s=cfg.fair_share_quantum_us / 1e6, slice_s=cfg.fair_share_slice_us / 1e6
            )
        reporter = self.reporter
        on_spooled = (lambda _n: reporter.wake()) if reporter is not None else None
        self._tasks = [
            loop.create_task(self.meter.run(on_spooled=on_spooled), name="orbit-usage-meter"),
            loop.create_task(self._stored_bytes_loop(), name="orbit-stored-bytes"),
        ]
        if self.load_reporter is not None:
            self._tasks.append(loop.create_task(self.load_reporter.run(), name="orbit-load-reporter"))

    def _load_reporter(self, token_source: ClientCredentials) -> LoadReporter:
        cfg = self.broker.config
        broker = self.broker
        return LoadReporter(
            LoadReports(cfg.broker_name, max_items=cfg.load_report_max_items, refresh_s=cfg.load_report_refresh_s),
            control_plane_url=cfg.control_plane_url,
            token=token_source.token,
            interval_s=cfg.load_report_interval_s,
            topics=lambda: broker.topics.topics,
            offset_table=lambda: broker.offsets.table,  # (a slave's table is replaced as it follows)
            max_offset=broker.store.max_offset_in_queue,
            refused=self.refused_topics,
            is_master=lambda: broker.is_master,
        )

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self.reporter is not None:
            await self.reporter.stop()
        if self._token_source is not None:
            await self._token_source.aclose()
        await self.auth.stop()

    # --- every request ------------------------------------------------------------------------------
    def before(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand | None] | None:
        r = self.auth.check(cmd)
        if r is UNCHECKED:
            return None
        if isinstance(r, Principal):
            return self._admit(conn, r, cmd)
        if isinstance(r, Denial):
            return self._denied(conn, cmd, r)
        return self._admit_later(conn, r, cmd)

    def _denied(self, conn: Connection, cmd: RemotingCommand, d: Denial) -> RemotingCommand:
        reason = "credentials" if _AUTHENTICATION_REMARKS.search(d.remark) else "permission"
        self.refusals(reason, "refused request code %d from %s (%s): %s", cmd.code, conn.peer, reason, d.remark)
        return d.response(cmd)

    async def _admit_later(
        self, conn: Connection, pending: Awaitable[Principal | Denial], cmd: RemotingCommand
    ) -> RemotingCommand | None:
        r = await pending
        if isinstance(r, Denial):
            return self._denied(conn, cmd, r)
        return self._admit(conn, r, cmd)

    def _admit(self, conn: Connection, principal: Principal, cmd: RemotingCommand) -> RemotingCommand | None:
        tenant = principal.tenant
        if tenant != "*":
            if tenant in self.suspended:
                return cmd.response(ResponseCode.NO_PERMISSION, f"tenant {tenant} is suspended")
            if "tenant" not in conn.attrs and (refused := self._count_connection(conn, tenant, cmd)) is not None:
                return refused
            body = cmd.body
            self.meter.record_request(tenant, len(body) if body is not None else 0, 0)
        return None

    # --- connections ---------------------------------------------------------------------------------
    def _count_connection(self, conn: Connection, tenant: str, cmd: RemotingCommand) -> RemotingCommand | None:
        """Count ``conn`` for ``tenant`` (its first authenticated request), or refuse it: the
        answer says why, then the connection is closed."""
        if conn.closed:  # gone while its credential was being checked: nothing to count
            return None
        held = self.connections.get(tenant, 0)
        # The tenant's plan limit, within the broker's own (max_connections_per_tenant); 0 is none.
        most = min((n for n in (self.tenant_max_connections.get(tenant, 0), self.max_connections) if n), default=0)
        if most and held >= most:
            log.warning("tenant %s: refusing connection %s, it holds %d (max_connections_per_tenant)",
                        tenant, conn.peer, held)  # fmt: skip
            asyncio.get_running_loop().call_soon(conn.close)  # after the answer is written
            self.meter.record_throttled(tenant)
            return cmd.response(
                ResponseCode.SYSTEM_BUSY,
                f"tenant {tenant} holds {held} connections to this broker, the most it may; close some first",
            )
        conn.attrs["tenant"] = tenant
        self.connections[tenant] = held + 1
        cell = self.tenant_load.get(tenant)
        if cell is None:
            cell = self.tenant_load[tenant] = [0, self.tenant_inflight_limits.get(tenant, 0)]
        conn.tenant_load = cell
        conn.on_tenant_busy = self._busy_counter(tenant)
        if self.fair_share is not None:
            conn.share = self.fair_share.tenant(tenant)
        return None

    def _busy_counter(self, tenant: str) -> Callable[[], None]:
        """What a connection of ``tenant`` calls when it refuses a request over the tenant's
        requests in flight (``max_inflight_requests``): a throttled request."""
        meter = self.meter
        return lambda: meter.record_throttled(tenant)

    def connection_closed(self, conn: Connection) -> None:
        tenant = conn.attrs.pop("tenant", None)
        if tenant is None:
            return
        left = self.connections.get(tenant, 0) - 1
        if left > 0:
            self.connections[tenant] = left
        else:
            self.connections.pop(tenant, None)
            cell = self.tenant_load.get(tenant)
            if cell is not None and cell[0] <= 0:
                del self.tenant_load[tenant]
            if self.fair_share is not None:
                self.fair_share.forget(tenant)

    # --- sends and pulls ------------------------------------------------------------------------------
    def before_put(self, conn: Connection, cmd: RemotingCommand, msgs: list[Message]) -> RemotingCommand | None:
        tenant = tenant_of(msgs[0].topic)
        if tenant is None:
            return None
        refused = self._refused_writes(cmd, tenant)
        if refused is not None:
            self.refused_topics[msgs[0].topic] += 1
            return refused
        if len(msgs) == 1 and is_transactional(msgs[0].sys_flag, msgs[0].properties):
            # The check service sends the half (body and all) to a producer of its group: the
            # group must be the topic's tenant's, not another tenant's nor a shared unprefixed one.
            ext = cmd.ext_fields or {}
            group = msgs[0].properties.get(PROPERTY_PRODUCER_GROUP) or ext.get("a") or ext.get("producerGroup") or ""
            special, group_tenant, _name = parse_wire_name(group)
            if special or group_tenant != tenant:
                return cmd.response(
                    ResponseCode.NO_PERMISSION,
                    f"a transactional message to {msgs[0].topic!r} needs a producer group in tenant {tenant!r}'s "
                    f"namespace, not {group[:255]!r}",
                )
        nbytes = 0
        for m in msgs:
            nbytes += len(m.body)
        return self._counted(msgs[0].topic, self._publish_quota(cmd, tenant, len(msgs), nbytes))

    def _counted(self, topic: str, refused: RemotingCommand | None) -> RemotingCommand | None:
        """``refused``, counted for ``topic``'s load report when it is a refusal."""
        if refused is not None:
            self.refused_topics[topic] += 1
        return refused

    def meters(self, topic: str) -> bool:
        """Whether a publish to ``topic`` is counted against a tenant (a topic outside every
        tenant's namespace never is): send.py counts a plain batch's messages only then."""
        return tenant_of(topic) is not None

    def before_put_plain(self, cmd: RemotingCommand, topic: str, n: int, nbytes: int) -> RemotingCommand | None:
        """``before_put`` for a plain batch body (send.py): ``n`` messages of ``nbytes`` of bodies,
        none of them transactional."""
        tenant = tenant_of(topic)
        if tenant is None:
            return None
        return self._counted(topic, self._refused_writes(cmd, tenant) or self._publish_quota(cmd, tenant, n, nbytes))

    def _refused_writes(self, cmd: RemotingCommand, tenant: str) -> RemotingCommand | None:
        if tenant in self.suspended:
            return cmd.response(ResponseCode.NO_PERMISSION, f"tenant {tenant} is suspended")
        if tenant in self.over_storage:
            self.meter.record_throttled(tenant)
            return cmd.response(ResponseCode.FLOW_CONTROL, self._storage_remark(tenant))
        return None

    def throttle(self, conn: Connection, response: RemotingCommand) -> None:
        """A FLOW_CONTROL answer was written on ``conn``: stop reading it until the answer's
        retry-after (the tenant's bucket, so every connection of the tenant resumes on the same
        schedule), at most ``quota_throttle_max_ms``."""
        wait_ms = parse_retry_after_ms(response.remark)
        if wait_ms:
            self._throttle(conn, wait_ms)

    def _throttle(self, conn: Connection, wait_ms: int) -> None:
        """Stop reading ``conn`` for ``wait_ms``, at most ``quota_throttle_max_ms`` (0: never)."""
        most_ms = self.broker.config.quota_throttle_max_ms
        if most_ms > 0:
            conn.throttle(min(wait_ms, most_ms) / 1000)
            self.throttled += 1

    def _publish_quota(self, cmd: RemotingCommand, tenant: str, n: int, nbytes: int) -> RemotingCommand | None:
        wait_ms = self.quotas.acquire_publish(tenant, n, nbytes)
        if wait_ms:
            self.quota_refusals += 1
            self.meter.record_throttled(tenant)
            return cmd.response(ResponseCode.FLOW_CONTROL, self._publish_remark(tenant, wait_ms))
        return None

    def _publish_remark(self, tenant: str, wait_ms: int) -> str:
        limits = self.quotas.limits_of(tenant)
        return flow_control_remark(tenant, "publish", wait_ms, limits.publish_msgs_per_s if limits else None)

    def refuse_send_early(self, conn: Connection, frame: Body) -> bytes | None:
        """The frame path of a connection under tenancy (``Connection.frame_handler``): a single
        send (SEND_MESSAGE_V2) to a topic of the tenant this connection authenticated as, while
        that tenant is over its publish quota here, is answered FLOW_CONTROL straight from its
        frame — no command object, no authentication, nothing stored — and the connection is
        throttled as any refusal throttles it. Refusing needs no proof of who asks: the answer
        grants nothing. Anything else (None) takes the command path, which checks everything."""
        tenant = conn.attrs.get("tenant")
        if tenant is None:
            return None
        f = send_fields(frame, 0)
        if f is None:
            return None
        topic = f[2]
        if not topic.startswith(tenant) or tenant_of(topic) != tenant:
            return None
        wait_ms = self.quotas.refuse_publish(tenant, 1, len(f[9]))
        if not wait_ms:
            return None
        self.early_refusals += 1
        self.meter.record_throttled(tenant)
        self.refused_topics[topic] += 1
        self._throttle(conn, wait_ms)
        return flow_control_frame(f[1], f[0], self._publish_remark(tenant, wait_ms))

    def allows_stored_topic(self, cmd: RemotingCommand, topic: str, action: str) -> bool:
        """For the deferred codes (END_TRANSACTION: publish, VIEW_MESSAGE_BY_ID: subscribe): may the
        request's principal ``action`` the stored message's topic? Callers answer a refusal as
        "not found", so other tenants' offsets leak nothing."""
        if not self.enabled:
            return True
        try:
            principal = self.auth.authenticate(cmd)  # before() accepted it: cached, no I/O
        except AuthError:
            return False
        return self.auth.authorize_stored_topic(principal, topic, action) is None

    def allows_stored_record(self, cmd: RemotingCommand, record: bytes | memoryview, action: str) -> bool:
        """``allows_stored_topic`` for the topic of a raw CommitLog record (False if unreadable)."""
        try:
            topic = parse_record(record, check_crc=False).topic
        except RecordError:
            return False
        return self.allows_stored_topic(cmd, topic, action)

    def stored_topics_denial(self, cmd: RemotingCommand, topics: Iterable[str], action: str) -> str | None:
        """For a handler that acts on a stored record the request names only by its CommitLog
        offset: why the request's principal may not ``action`` every one of ``topics`` (the
        record's), or None when it may (always None with authentication off)."""
        if not self.enabled:
            return None
        try:
            principal = self.auth.authenticate(cmd)  # before() accepted it: cached, no I/O
        except AuthError as e:
            return e.remark
        for topic in topics:
            d = self.auth.authorize_stored_topic(principal, topic, action)
            if d is not None:
                return d.remark
        return None

    def refuse(self, conn: Connection, cmd: RemotingCommand, remark: str, reason: str) -> RemotingCommand:
        """NO_PERMISSION with ``remark``, for a refusal a handler decides itself once it has read
        what the request names. Logged as one line (request code, source address, principal,
        ``reason``, which may name what ``remark`` keeps from the client; no secret nor token)
        and counted with the authorizer's refusals (``auth.denied``)."""
        self.auth.denied += 1
        try:
            p = self.auth.authenticate(cmd)
            who = f"{p.role} {p.subject!r}"
            if p.role == "tenant":
                who = f"credential {p.subject!r} of tenant {p.tenant!r}"
        except AuthError:
            who = "an unauthenticated client"
        self.refusals("stored_record", "refused request code %d from %s (%s): %s", cmd.code, conn.peer, who, reason)
        return cmd.response(ResponseCode.NO_PERMISSION, remark)

    def before_pull(self, cmd: RemotingCommand, topic: str) -> RemotingCommand | None:
        tenant = tenant_of(topic)
        if tenant is None:
            return None
        wait_ms = self.quotas.acquire_consume(tenant, 0, 0)
        if wait_ms:
            self.meter.record_throttled(tenant)
            self.refused_topics[topic] += 1
            return cmd.response(ResponseCode.FLOW_CONTROL, flow_control_remark(tenant, "consume", wait_ms))
        return None

    def after_pull(self, topic: str, msgs: int, nbytes: int) -> None:
        tenant = tenant_of(topic)
        if tenant is not None:
            self.quotas.charge_consume(tenant, msgs, nbytes)
            self.meter.record_request(tenant, 0, nbytes, msgs)

    def after_put(self, topic: str, msgs: int) -> None:
        """``msgs`` sent to ``topic`` were stored (send.py, once per send: a transactional message
        when its half is, a delayed one when it is taken for later)."""
        tenant = tenant_of(topic)
        if tenant is not None:
            self.meter.record_stored(tenant, msgs)

    # --- the control plane's snapshot -----------------------------------------------------------------
    async def sync(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """ORBIT_SYNC_TENANCY: apply a whole snapshot (older versions are ignored). Operators only
        (the control plane's reconciler): a broker credential, which every broker host holds, may
        not push credentials or the HA link's secret to other brokers."""
        if self.enabled:
            try:
                principal = self.auth.authenticate(cmd)  # before() accepted it: cached, no I/O
            except AuthError as e:
                return self.refuse(conn, cmd, e.remark, "tenancy snapshot: authentication")
            if principal.role != "operator":
                why = "the tenancy snapshot comes from the control plane (operators only)"
                return self.refuse(conn, cmd, why, f"tenancy snapshot from a {principal.role} credential")
        try:
            snap = parse_snapshot(cmd.body_bytes())
        except TenancyError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        if snap["version"] < self.version:
            return cmd.response(ResponseCode.SUCCESS, f"version {snap['version']} is older than {self.version}")
        store = self.auth.credentials
        if store is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "this broker keeps no credentials (auth is off)")
        try:
            await store.apply(snap["credentials"], snap["version"])
        except (ValueError, TypeError, KeyError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"credentials: {e}")
        self._apply_tenants(snap)
        if "ha_secret" in snap and self.broker.replication is not None:
            try:
                await self.broker.replication.link.update(decode_ha_secret(snap["ha_secret"]))
            except OSError as e:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"cannot keep the HA link secret: {e.strerror}")
        doc = {
            "version": snap["version"],
            "tenants": snap["tenants"],
            "topic_retention_hours": snap["topic_retention_hours"],
            "topic_local_retention_hours": snap["topic_local_retention_hours"],
        }
        await asyncio.to_thread(self._state_file.save, doc)
        return cmd.response(ResponseCode.SUCCESS)

    def _apply_tenants(self, snap: TenancySnapshot) -> None:
        limits: dict[str, Limits] = {}
        storage: dict[str, int] = {}
        tiered: dict[str, int] = {}
        suspended = set()
        for t in snap["tenants"]:
            if t["status"] == "suspended":
                suspended.add(t["id"])
            if t.get("limits") is not None:
                limits[t["id"]] = Limits.from_dict(t["limits"] or {})
            if (cap := t.get("storage_bytes")) is not None:
                storage[t["id"]] = cap
            if (cap := t.get("max_tiered_bytes")) is not None:
                tiered[t["id"]] = cap
        self.quotas.replace_limits(limits)
        self.storage_limits = storage
        self.tiered_limits = tiered
        self.tenant_max_connections = {
            t["id"]: t["max_connections"] for t in snap["tenants"] if t.get("max_connections") is not None
        }
        self.tenant_inflight_limits = {
            t["id"]: t["max_inflight_requests"] for t in snap["tenants"] if t.get("max_inflight_requests") is not None
        }
        for tenant, cell in self.tenant_load.items():
            cell[1] = self.tenant_inflight_limits.get(tenant, 0)
        # Retention is per CommitLog file: keep files as long as the longest promise made here
        # (inf, never past retention, once a topic here keeps its messages for good).
        store = self.broker.store
        if store is not None:
            promised = {t: math.inf if h is None else h for t, h in snap["topic_retention_hours"].items()}
            store.retention_hours = max([store.config.file_reserved_time_hours, *promised.values()])
            store.topic_retention_hours = promised
            store.topic_local_retention_hours = dict(snap["topic_local_retention_hours"])  # (docs/tiered_storage.md)
        self.suspended = frozenset(suspended)
        self.version = snap["version"]

    # --- stored bytes and the storage quotas ------------------------------------------------------------
    def stored_bytes(self) -> TenantBytes:
        """Per tenant: its bytes on this broker's disk and in object storage only (tenant_storage.py)."""
        return measure(self.broker.store, self.broker.topics.topics)

    def check_storage(self) -> TenantBytes:
        """Measure, meter, and refuse sends of tenants over either storage share from now on: the
        bytes on this broker's disk (``storage_bytes``) or in object storage (``max_tiered_bytes``)."""
        measured = self.stored_bytes()
        self.meter.replace_stored_bytes(measured.local, measured.tiered)
        self.stored, self.tiered = measured.local, measured.tiered
        over = {t for t in self.storage_limits.keys() | self.tiered_limits.keys() if self._storage_over(t)}
        for t in over - self.over_storage:
            log.warning("tenant %s is over its storage quota here (%s): sends refused", t, self._storage_over(t))
        self.over_storage = frozenset(over)
        return measured

    def _storage_over(self, tenant: str) -> str:
        """Which storage share ``tenant`` is over, in words ("" when none)."""
        cap = self.storage_limits.get(tenant)
        if cap is not None and self.stored.get(tenant, 0) >= cap:
            return f"{self.stored.get(tenant, 0)} of {cap} bytes on disk"
        cap = self.tiered_limits.get(tenant)
        if cap is not None and self.tiered.get(tenant, 0) >= cap:
            return f"{self.tiered.get(tenant, 0)} of {cap} bytes in object storage"
        return ""

    def _storage_remark(self, tenant: str) -> str:
        wait_ms = max(1000, int(self.broker.config.storage_check_interval_s * 1000))
        return (
            f"[TOO_MANY_REQUESTS] tenant {tenant!r} is over its storage quota on this broker "
            f"({self._storage_over(tenant)}; consume or let retention free space), retry-after-ms={wait_ms}"
        )

    async def _stored_bytes_loop(self) -> None:
        while True:
            try:
                self.check_storage()
            except Exception:  # a bad round must not end the watch
                log.exception("measuring tenants' stored bytes failed")
            await asyncio.sleep(self.broker.config.storage_check_interval_s)
