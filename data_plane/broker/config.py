"""BrokerConfig: one frozen object per broker process, read once at start.

Sources, later wins: defaults here → a TOML file (top-level keys are BrokerConfig fields, a
``[store]`` table holds StoreConfig fields) → command-line flags. Units are in the names.

    broker_name = "broker-a"
    cluster_name = "DefaultCluster"
    listen = "0.0.0.0:10911"
    namesrv_addrs = ["127.0.0.1:9876"]
    store_dir = "/var/lib/orbit/broker-a"

    [store]
    flush_disk_type = "SYNC_FLUSH"
    commit_log_file_size_bytes = 1073741824
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from data_plane.remoting.limits import InboundLimits
from data_plane.store.config import FlushDiskType, StoreConfig
from data_plane.store.idle_queues import idle_problem
from data_plane.tls import ServerTls


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class ConfigError(ValueError):
    """A config file or flag that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    broker_id: int = 0  # 0 = master
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    listen: str = "127.0.0.1:10911"
    # The address published to name servers and clients (default: the listen address, or
    # 127.0.0.1 when listening on every interface).
    advertised_host: str = ""
    # The client port published to name servers and written into message ids (the store host),
    # when clients reach this broker through a port other than the one it binds (a proxy, a NAT).
    # 0 = the bound port.
    advertised_port: int = 0
    namesrv_addrs: tuple[str, ...] = ()
    store_dir: str = "./orbit-data/broker-a"
    register_interval_s: float = 30.0
    register_timeout_ms: int = 6_000
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 4
    max_topic_queue_nums: int = 1024
    long_polling_enable: bool = True
    max_suspend_ms: int = 60_000
    short_polling_ms: int = 1_000  # hold time when long polling is off
    channel_expired_s: float = 120.0
    client_scan_interval_s: float = 10.0
    rebalance_lock_expiry_s: float = 60.0
    consumer_offset_persist_interval_s: float = 1.0
    idle_timeout_s: float = 120.0
    loop_lag_warn_ms: float = 20.0  # log event-loop stalls longer than this
    # A stall this long gets the loop thread's stack logged, taken while it lasts (0: off;
    # stall_watch.py)
    loop_stall_watch_ms: float = 50.0
    # How long the event loop may keep the GIL while a store thread (group commit, flushes)
    # waits for it: CPython's default is 5,000 us. docs/broker.md, "GIL switch interval"
    gil_switch_interval_us: int = 500
    max_frame_bytes: int = 16 * 1024 * 1024
    # --- Inbound limits (data_plane/remoting/limits.py): what peers can make the broker hold -----------
    # Bytes all connections' incomplete frames may reserve (a frame reserves its size once its length
    # prefix is in); the connection whose frame would pass it is closed.
    max_partial_frame_bytes_total: int = 256 * 1024 * 1024
    # A connection not yet proven (authenticated; with auth off: no complete frame yet) may send a
    # frame this large; larger ones only within max_large_first_frame_bytes_total, shared by all
    # unproven connections (0: refused), so a client whose first request is a big send still works.
    max_first_frame_bytes: int = 1024 * 1024
    max_large_first_frame_bytes_total: int = 32 * 1024 * 1024
    frame_complete_timeout_ms: int = 30_000  # a frame's first to last byte; a trickling peer is closed
    max_connections_per_address: int = 1_000  # from one source IP; past it a new connection is closed
    max_connections_total: int = 10_000
    # --- TLS (data_plane/tls.py): the client port's mode (disabled | permissive | enforcing; permissive
    # serves TLS and plain TCP on one port) with its certificate chain and key (PEM); tls_ca_file, when
    # set, is the CA this broker verifies name servers by, and it registers over TLS.
    # A connection answered FLOW_CONTROL (its tenant over quota) is not read again until the
    # answer's retry-after has passed, at most this long (0: answered, never throttled): a flood
    # then costs the broker nothing beyond the socket buffers. Off by default: a client that
    # keeps sending while throttled (the SDK does) has its requests wait in the socket and time
    # out (docs/quotas_and_metering.md).
    quota_throttle_max_ms: int = 0
    tls_mode: str = "disabled"
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    # The answers to one read's requests leave in writes of at most this many frames (0: one
    # write a read), so a client pipelining on one connection starts on them early. docs/broker.md
    answer_slice: int = 4
    max_pull_messages: int = 1024
    # Requests a connection may have being handled at once (past that: SYSTEM_BUSY). Pulls held
    # for long polling wait rather than work and count apart: a consumer holds one a queue.
    max_requests_in_flight_per_connection: int = 4096
    max_held_pulls_per_connection: int = 32_768  # past either cap a pull is answered at once
    max_held_pulls: int = 100_000
    max_query_messages: int = 64
    # --- Transactional messages (docs/transactions.md) ---------------------------------------------
    transaction_timeout_ms: int = 6_000  # an unresolved half message is first checked this old
    transaction_check_interval_ms: int = 30_000  # then again this often
    transaction_check_max: int = 15  # checks before the broker rolls the transaction back
    transaction_check_scan_interval_ms: int = 1_000  # how often the check service looks for due halves
    # --- Filters and message trace (docs/filters_and_trace.md) -----------------------------------
    enable_property_filter: bool = True  # RocketMQ's enablePropertyFilter: SQL92 subscriptions
    # Broker-side message trace into ORBIT_SYS_TRACE (data_plane/broker/trace.py). Off by default:
    # it costs ~20 µs of loop time per message sent and consumed (measured, docs/filters_and_trace.md).
    trace_enabled: bool = False
    trace_flush_interval_ms: int = 100  # buffered trace events are written at least this often
    trace_batch_max: int = 256  # ... or as soon as this many wait
    trace_buffer_max: int = 65_536  # events waiting beyond this are dropped and counted, never waited for
    # --- Tenancy (docs/broker.md#tenancy): identity, authorization, quotas, metering --------------
    # With auth on, every request must carry a JWT or a RocketMQ ACL signature and may only touch
    # its tenant's resources; topics and groups are then created by the control plane only.
    auth_enabled: bool = False
    control_plane_url: str = ""  # usage reports go here; the JWKS too unless jwks_url is set
    jwks_url: str = ""
    jwks_refresh_interval_s: float = 300.0
    # A file holding this broker's own credential (role "broker": access_key and secret, TOML or
    # JSON) used to report usage. Never logged.
    broker_credentials_file: str = ""
    # The usage reporter's idle wait between looks at the spool, and its longest backoff.
    usage_report_interval_s: float = 60.0
    # How often usage counters become records (a divisor of 60 s; each record is keyed by the start
    # of its period, which the control plane counts in that period's minute). Short in tests.
    usage_roll_interval_s: float = 60.0
    # Load reports (docs/elasticity.md): every load_report_interval_s a master sends its tenant
    # topics' max offsets, consumer groups' committed offsets and refusals to the control plane, at
    # most load_report_max_items topics and groups a report; one unchanged (and without backlog) is
    # sent again only every load_report_refresh_s (at the next report past it, if the interval is longer).
    load_report_interval_s: float = 10.0
    load_report_max_items: int = 500
    load_report_refresh_s: float = 120.0
    # Also write every usage record as a message of the system topic ORBIT_SYS_USAGE (operators
    # only), which the Spark metering pipeline reads (data_plane/tenancy/usage_topic.py).
    usage_topic_enabled: bool = False
    quota_burst_s: float = 1.0  # a tenant's token buckets hold this many seconds of its rate
    # Connections one tenant may hold to this broker (0: no limit). A connection counts for the
    # tenant of its first authenticated request; past the limit that request is answered
    # SYSTEM_BUSY and the connection closed, so one tenant cannot use up the broker's sockets.
    max_connections_per_tenant: int = 1000
    # Fair share of the broker's loop between tenants when it is saturated (remoting/fair_share.py):
    # requests are handled as read until a loop turn's take fair_share_quantum_us; past that they
    # wait per tenant and are taken least-served tenant first, fair_share_slice_us at a time.
    fair_share: bool = True
    fair_share_quantum_us: int = 200
    fair_share_slice_us: int = 200
    # How often tenants' stored bytes are measured (metered, and checked against their storage share).
    storage_check_interval_s: float = 30.0
    # A ConsumeQueue neither written nor read for this long is closed to idle: its files flushed
    # and unmapped, no descriptor held, until its next append or read (store/idle_queues.py,
    # docs/idle_topics.md). 0: never.
    idle_queue_close_s: float = 86_400.0
    # OpenTelemetry (docs/broker.md#observability): "none", "console" or "otlp" (OTLP/HTTP to
    # OTEL_EXPORTER_OTLP_ENDPOINT and the other standard OTEL_* variables).
    telemetry: str = "none"
    # --- Delayed and timed messages (docs/delayed_messages.md) ----------------------------------------
    # RocketMQ's messageDelayLevel: the delay of DELAY=1, 2, ... (s m h d units).
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    timer_max_delay_s: int = 7 * 86_400  # timed messages further ahead are refused (MESSAGE_ILLEGAL)
    # A timer further ahead than this is stored again when the window has passed (kept shorter than
    # CommitLog retention, 72 h, so a pending timer's record is never deleted).
    timer_roll_window_s: int = 2 * 86_400
    timer_log_segment_units: int = 1 << 20  # 32-byte units per TimerLog file (32 MiB)
    schedule_tick_ms: int = 100  # how often due delayed and timed messages are looked for
    schedule_checkpoint_interval_ms: int = 1_000
    # --- High availability (docs/ha.md) ---------------------------------------------------------------
    # A master's replication port (RocketMQ's haListenPort). "" = the listen host and listen port + 1
    # (10912 next to 10911); port 0 picks a free port (tests), published to name servers.
    ha_listen: str = ""
    # The HA address a master publishes (host:port): haServerAddr in its registrations and runtime
    # info, and the ha_addr it tells the control plane, so slaves connect there. "" = the
    # advertised host and the bound HA port.
    ha_advertised: str = ""
    # --- RocketMQ 5 clients (docs/rocketmq5.md) ---------------------------------------------------------
    # The gRPC endpoint (apache.rocketmq.v2.MessagingService) for the official v5 clients, with
    # lease-based (POP) consumption. "" = none; port 0 picks a free port. TLS as the broker's.
    grpc_listen: str = ""
    # A slave's master HA address (host:port). "" = learned from the name server's answer to the
    # slave's registration (the master's published HA address), as RocketMQ does.
    ha_master_address: str = ""
    # SYNC_MASTER: how long a send waits for a slave to hold its bytes before FLUSH_SLAVE_TIMEOUT.
    ha_sync_timeout_ms: int = 3_000
    # SYNC_MASTER: a slave further behind than this is "not available" (SLAVE_NOT_AVAILABLE at once).
    ha_max_gap_bytes: int = 256 * 1024 * 1024
    # The HA link's secret (docs/ha.md, "The HA link"): a file only its owner may read (0600) that
    # every member of the group shares, for groups without a control plane. "" = with auth on, the
    # control plane's (sent with the tenancy sync); with auth off, an unauthenticated link.
    ha_secret_file: str = ""
    # How long a connecting peer has to complete the link's authentication before it is closed.
    ha_auth_timeout_ms: int = 5_000
    # A master tells a consumer reading data no longer in memory to read from a slave next (seed
    # 7.15; the store's access_message_in_memory_max_ratio decides "in memory").
    slave_read_enable: bool = True
    # Automatic failover through leases kept in the control plane's PostgreSQL (docs/ha.md#failover).
    failover_enabled: bool = False
    failover_lease_s: float = 6.0  # a master that cannot renew within this stops accepting writes
    failover_check_interval_s: float = 1.0
    # With failover: 1 — a SYNC_MASTER whose slaves have all been out for ha_in_sync_timeout_ms
    # answers SEND_OK alone once the control plane confirmed it the only electable member
    # (RocketMQ 5's minInSyncReplicas 1: writes go on through a cut link, on one copy); 2 — never
    # SEND_OK without a slave's copy (a cut link stops writes).
    ha_min_in_sync: int = 1
    ha_in_sync_timeout_ms: int = 3_000
    store: dict[str, Any] = field(default_factory=dict)  # StoreConfig overrides

    @property
    def server_tls(self) -> ServerTls:
        return ServerTls(self.tls_mode, self.tls_cert_file, self.tls_key_file)  # type: ignore[arg-type]

    @property
    def inbound_limits(self) -> InboundLimits:
        return InboundLimits(
            max_partial_frame_bytes_total=self.max_partial_frame_bytes_total,
            max_first_frame_bytes=self.max_first_frame_bytes,
            max_large_first_frame_bytes_total=self.max_large_first_frame_bytes_total,
            frame_complete_timeout_ms=self.frame_complete_timeout_ms,
            max_connections_per_address=self.max_connections_per_address,
            max_connections_total=self.max_connections_total,
        )

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0] or "0.0.0.0"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def effective_jwks_url(self) -> str:
        return self.jwks_url or (self.control_plane_url.rstrip("/") + "/.well-known/jwks.json")

    @property
    def is_master(self) -> bool:
        return self.broker_role is not BrokerRole.SLAVE

    def store_config(self, port: int) -> StoreConfig:
        values: dict[str, Any] = {"store_path": os.path.join(self.store_dir, "store")}
        values.update(self.store)
        values["store_host"] = self.advertised_host or _default_host(self.listen_host)
        values["store_port"] = self.advertised_port or port
        # A group's tiered objects live under <prefix>/<cluster>.<broker name>/ (both are names
        # without '/'): every member of the group, and any master after a failover, shares them.
        values.setdefault("tier_group", f"{self.cluster_name}.{self.broker_name}")
        try:
            if isinstance(values.get("flush_disk_type"), str):
                values["flush_disk_type"] = FlushDiskType(values["flush_disk_type"])
            return StoreConfig(**values)
        except (TypeError, ValueError) as e:  # a wrong type, or a value __post_init__ refuses
            raise ConfigError(f"[store]: {e}") from None

    def validate(self) -> BrokerConfig:
        from data_plane.store.message import validate_topic

        problems = []
        if validate_topic(self.broker_name) is not None:
            problems.append(f"broker_name {self.broker_name!r} is not a valid name")
        if self.broker_id < 0:
            problems.append("broker_id must be >= 0")
        problems.extend(self.inbound_limits.problems(self.max_frame_bytes))
        try:
            self.server_tls.validate()
        except ValueError as e:
            problems.append(str(e))
        if not 0 <= self.answer_slice <= 4096:
            problems.append("answer_slice must be 0..4096 (0: one write for all of a read's answers)")
        if self.loop_stall_watch_ms != 0 and not 10 <= self.loop_stall_watch_ms <= 60_000:
            problems.append("loop_stall_watch_ms must be 0 (off) or 10..60000")
        if not 50 <= self.gil_switch_interval_us <= 100_000:
            problems.append("gil_switch_interval_us must be 50..100000")
        if (self.broker_id == 0) != self.is_master:
            problems.append(f"broker_id {self.broker_id} does not match role {self.broker_role.value}")
        if self.broker_id >= 100:
            problems.append("broker_id must be < 100 (100 is a former master's id while it is a slave)")
        if self.grpc_listen and not self.grpc_listen.rpartition(":")[2].isdigit():
            problems.append(f"grpc_listen {self.grpc_listen!r} is not host:port")
        if self.ha_listen and not self.ha_listen.rpartition(":")[2].isdigit():
            problems.append(f"ha_listen {self.ha_listen!r} is not host:port")
        if not 0 <= self.advertised_port < 65536:
            problems.append(f"advertised_port must be 0..65535 (0: the bound port), not {self.advertised_port}")
        if self.ha_advertised and not _is_host_port(self.ha_advertised):
            problems.append(f"ha_advertised {self.ha_advertised!r} is not host:port (a port 1..65535)")
        if self.ha_master_address and not self.ha_master_address.rpartition(":")[2].isdigit():
            problems.append(f"ha_master_address {self.ha_master_address!r} is not host:port")
        if self.ha_sync_timeout_ms <= 0:
            problems.append("ha_sync_timeout_ms must be > 0")
        if not 0 <= self.quota_throttle_max_ms <= 60_000:
            problems.append("quota_throttle_max_ms must be 0..60000")
        if not 100 <= self.ha_auth_timeout_ms <= 60_000:
            problems.append("ha_auth_timeout_ms must be 100..60000")
        if self.ha_secret_file:
            from data_plane.broker.ha_link import read_secret_file

            try:
                read_secret_file(self.ha_secret_file)
            except ConfigError as e:
                problems.append(str(e))
        if self.failover_enabled and not (self.control_plane_url and self.broker_credentials_file):
            problems.append("failover_enabled needs control_plane_url and broker_credentials_file (the leases)")
        if self.failover_enabled and self.ha_master_address:
            problems.append("ha_master_address is for a fixed master: with failover_enabled the control plane names it")
        if self.ha_min_in_sync not in (1, 2):
            problems.append("ha_min_in_sync must be 1 (a master may acknowledge alone) or 2 (never without a slave)")
        if not 0 < self.ha_in_sync_timeout_ms <= 600_000:
            problems.append("ha_in_sync_timeout_ms must be within 1..600000")
        if self.failover_lease_s <= 2 * self.failover_check_interval_s:
            problems.append("failover_lease_s must be more than twice failover_check_interval_s")
        _host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            problems.append(f"listen {self.listen!r} is not host:port")
        for a in self.namesrv_addrs:
            if not a.rpartition(":")[2].isdigit():
                problems.append(f"name server address {a!r} is not host:port")
        if self.auth_enabled and not (self.jwks_url or self.control_plane_url):
            problems.append("auth_enabled needs control_plane_url or jwks_url (where the token keys are)")
        for name in ("control_plane_url", "jwks_url"):
            url = getattr(self, name)
            if url and not url.startswith(("http://", "https://")):
                problems.append(f"{name} {url!r} is not an http(s) URL")
        if (idle := idle_problem(self.idle_queue_close_s)) is not None:
            problems.append(idle)
        if self.storage_check_interval_s <= 0:
            problems.append("storage_check_interval_s must be > 0")
        if self.quota_burst_s <= 0:
            problems.append("quota_burst_s must be > 0")
        if self.max_connections_per_tenant < 0:
            problems.append("max_connections_per_tenant must be >= 0 (0: no limit)")
        if not 0 <= self.fair_share_quantum_us <= 1_000_000:
            problems.append("fair_share_quantum_us must be 0..1000000")
        if not 1 <= self.fair_share_slice_us <= 1_000_000:
            problems.append("fair_share_slice_us must be 1..1000000")
        if self.usage_report_interval_s <= 0:
            problems.append("usage_report_interval_s must be > 0")
        if not 0.05 <= self.load_report_interval_s <= 3600:
            problems.append("load_report_interval_s must be within 0.05..3600")
        if not 1 <= self.load_report_max_items <= 10_000:
            problems.append("load_report_max_items must be within 1..10000")
        if not 1 <= self.load_report_refresh_s <= 86_400:
            problems.append("load_report_refresh_s must be within 1..86400")
        roll_ms = round(self.usage_roll_interval_s * 1000)
        if roll_ms < 1000 or 60_000 % roll_ms:
            problems.append("usage_roll_interval_s must be a whole number of seconds dividing 60")
        if self.telemetry not in ("none", "console", "otlp"):
            problems.append(f"telemetry {self.telemetry!r} is not one of none, console, otlp")
        for name in ("transaction_timeout_ms", "transaction_check_interval_ms", "transaction_check_scan_interval_ms"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.transaction_check_max < 0:
            problems.append("transaction_check_max must be >= 0")
        for name in ("max_requests_in_flight_per_connection", "max_held_pulls_per_connection", "max_held_pulls"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if not 1 <= self.default_topic_queue_nums <= self.max_topic_queue_nums:
            problems.append("default_topic_queue_nums must be within 1..max_topic_queue_nums")
        unknown = set(self.store) - {f.name for f in dataclasses.fields(StoreConfig)}
        if unknown:
            problems.append(f"unknown [store] keys: {', '.join(sorted(unknown))}")
        else:
            # Build the store's config now (port 0 stands in for the bound port): a bad store
            # value is a config error at load time, not a traceback once the broker starts.
            try:
                self.store_config(0)
            except ConfigError as e:
                problems.append(str(e))
        from data_plane.broker.schedule import config_problems

        problems.extend(config_problems(self))
        if problems:
            raise ConfigError("; ".join(problems))
        return self


def _default_host(listen_host: str) -> str:
    return "127.0.0.1" if listen_host in ("", "0.0.0.0", "::") else listen_host


def _is_host_port(addr: str) -> bool:
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def advertised_address(config: BrokerConfig, port: int) -> str:
    """The client address published for a broker bound to ``port``."""
    return f"{config.advertised_host or _default_host(config.listen_host)}:{config.advertised_port or port}"


_FIELDS = {f.name: f for f in dataclasses.fields(BrokerConfig)}


def _coerce(name: str, value: Any) -> Any:
    f = _FIELDS.get(name)
    if f is None:
        raise ConfigError(f"unknown broker setting {name!r}")
    default = f.default if f.default is not dataclasses.MISSING else None
    try:
        if name == "broker_role":
            return BrokerRole(str(value).upper())
        if name == "namesrv_addrs":
            if isinstance(value, str):
                return tuple(a.strip() for a in value.replace(",", ";").split(";") if a.strip())
            return tuple(str(a) for a in value)
        if name == "store":
            if not isinstance(value, dict):
                raise ConfigError("[store] must be a table")
            return dict(value)
        if isinstance(default, bool):
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(f"{value!r} is not a boolean")
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"{value!r} is not a whole number")
            return int(value)
        if isinstance(default, float):
            return float(value)
        return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"setting {name!r}: {e}") from None


def load(path: str | None = None, overrides: dict[str, Any] | None = None) -> BrokerConfig:
    """Defaults ← TOML file at ``path`` ← ``overrides`` (flag values; None means unset)."""
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
        for k, v in raw.items():
            values[k] = _coerce(k, v)
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k == "store":
            merged = dict(values.get("store", {}))
            merged.update(v)
            values["store"] = merged
        else:
            values[k] = _coerce(k, v)
    return BrokerConfig(**values).validate()
