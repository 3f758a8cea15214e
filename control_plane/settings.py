"""Settings: one frozen object per control-plane process, read once at start.

Sources, later wins: defaults → environment (``ORBIT_*``, ``DATABASE_URL``) → command-line
flags (``server.main``). The master key is a secret: it never appears in ``repr``.

| field | env | flag |
|---|---|---|
| listen | ORBIT_CONTROL_LISTEN | --listen HOST:PORT |
| database_url | DATABASE_URL | --database-url |
| master key | ORBIT_MASTER_KEY (base64 of 32 bytes), ORBIT_MASTER_KEY_FILE | --master-key-file |
| token_lifetime_s | ORBIT_TOKEN_LIFETIME_S | --token-lifetime-s |
| bootstrap_credentials_file | ORBIT_BOOTSTRAP_CREDENTIALS_FILE | --bootstrap-credentials-file |
| json_body_limit_bytes | ORBIT_JSON_BODY_LIMIT_BYTES | |
| telemetry (none, console, otlp) | ORBIT_TELEMETRY | --telemetry |
| load_history_hours (brokers' load samples kept) | ORBIT_LOAD_HISTORY_HOURS | |
| autoscale_interval_s (0: no autoscaler) | ORBIT_AUTOSCALE_INTERVAL_S | --autoscale-interval-s |
| queue_capacity_msgs_per_s (what a queue sustains) | ORBIT_QUEUE_CAPACITY_MSGS_PER_S | |
| scale_window_s, scale_down_after_s | ORBIT_SCALE_WINDOW_S, ORBIT_SCALE_DOWN_AFTER_S | |
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

MASTER_KEY_BYTES = 32
DEFAULT_TOKEN_LIFETIME_S = 900
DEFAULT_JSON_BODY_LIMIT_BYTES = 64 * 1024


class SettingsError(ValueError):
    """A setting that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class MasterKey:
    """32 bytes sealing credential secrets and signing keys (AES-256-GCM). Never printed."""

    value: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.value) != MASTER_KEY_BYTES:
            raise SettingsError(f"the master key must be {MASTER_KEY_BYTES} bytes, not {len(self.value)}")

    def __repr__(self) -> str:
        return "MasterKey(**hidden**)"

    @classmethod
    def from_base64(cls, text: str) -> MasterKey:
        try:
            raw = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise SettingsError("the master key is not valid base64") from None
        return cls(raw)

    @classmethod
    def from_file(cls, path: str, *, create: bool = False) -> MasterKey:
        """Read a key file (base64 text). With ``create``, a missing file is made: a fresh random
        key written with mode 0600 (the dev and test path)."""
        if create and not os.path.exists(path):
            key = secrets.token_bytes(MASTER_KEY_BYTES)
            write_private_file(path, base64.b64encode(key).decode() + "\n")
            return cls(key)
        try:
            with open(path) as f:
                return cls.from_base64(f.read())
        except OSError as e:
            raise SettingsError(f"cannot read master key file {path}: {e.strerror}") from None


def write_private_file(path: str, text: str) -> None:
    """Write ``text`` to a file only its owner can read (0600, from its creation on). The file
    appears whole or not at all: written beside it under a temporary name, synced, then renamed
    over ``path`` — a reader polling for it (``orbit dev up`` waits for ready files so) never
    finds it empty or half written, and a crash leaves the old content."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True, slots=True)
class Settings:
    master_key: MasterKey
    database_url: str = ""  # empty: server.main starts an embedded PostgreSQL
    listen: str = "127.0.0.1:8080"
    token_lifetime_s: int = DEFAULT_TOKEN_LIFETIME_S
    bootstrap_credentials_file: str = ""  # empty: no operator credential is bootstrapped
    json_body_limit_bytes: int = DEFAULT_JSON_BODY_LIMIT_BYTES
    issuer: str = "orbit"
    audience: str = "orbit"
    pool_min_size: int = 1
    pool_max_size: int = 10
    # The reconciler's round interval (0: no reconciler); a change through the API runs one at once.
    reconcile_interval_s: float = 5.0
    # OpenTelemetry (docs/control_plane.md#observability): "none", "console" or "otlp".
    telemetry: str = "none"
    # Brokers' load samples (docs/elasticity.md) are kept this long, pruned every load_prune_interval_s.
    load_history_hours: float = 48.0
    load_prune_interval_s: float = 600.0
    # The autoscaler (docs/elasticity.md): its round interval (0: none), what one queue sustains,
    # the window publish rates are measured over, and how long a low rate lasts before queues go.
    autoscale_interval_s: float = 10.0
    queue_capacity_msgs_per_s: float = 1000.0
    scale_window_s: float = 20.0
    scale_down_after_s: float = 60.0

    def __post_init__(self) -> None:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise SettingsError(f"listen {self.listen!r} is not HOST:PORT")
        if not 60 <= self.token_lifetime_s <= 86_400:
            raise SettingsError("token_lifetime_s must be within 60..86400")
        if self.reconcile_interval_s < 0:
            raise SettingsError("reconcile_interval_s must be >= 0 (0 turns the reconciler off)")
        if not 1024 <= self.json_body_limit_bytes <= 16 * 1024 * 1024:
            raise SettingsError("json_body_limit_bytes must be within 1 KiB..16 MiB")
        if self.telemetry not in ("none", "console", "otlp"):
            raise SettingsError(f"telemetry {self.telemetry!r} is not one of none, console, otlp")
        if not 1 <= self.load_history_hours <= 24 * 93:
            raise SettingsError("load_history_hours must be within 1..2232 (93 days)")
        if not 0.05 <= self.load_prune_interval_s <= 86_400:
            raise SettingsError("load_prune_interval_s must be within 0.05..86400")
        if not (self.autoscale_interval_s == 0 or 0.1 <= self.autoscale_interval_s <= 3600):
            raise SettingsError("autoscale_interval_s must be 0 (no autoscaler) or within 0.1..3600")
        if not 1 <= self.queue_capacity_msgs_per_s <= 10_000_000:
            raise SettingsError("queue_capacity_msgs_per_s must be within 1..10000000")
        if not 1 <= self.scale_window_s <= 3600:
            raise SettingsError("scale_window_s must be within 1..3600")
        if not 0 <= self.scale_down_after_s <= 86_400:
            raise SettingsError("scale_down_after_s must be within 0..86400")

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def __repr__(self) -> str:  # the database URL may hold a password
        return f"Settings(listen={self.listen!r}, token_lifetime_s={self.token_lifetime_s})"

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        master_key_file: str | None = None,
        create_master_key: bool = False,
        **overrides: object,
    ) -> Settings:
        """Settings from the environment, then ``overrides`` (flags; ``None`` values are skipped).
        The master key: ``master_key_file`` (flag), else ``ORBIT_MASTER_KEY``, else
        ``ORBIT_MASTER_KEY_FILE``; ``create_master_key`` makes a missing key file."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name, var, kind in (
            ("listen", "ORBIT_CONTROL_LISTEN", str),
            ("database_url", "DATABASE_URL", str),
            ("token_lifetime_s", "ORBIT_TOKEN_LIFETIME_S", int),
            ("bootstrap_credentials_file", "ORBIT_BOOTSTRAP_CREDENTIALS_FILE", str),
            ("json_body_limit_bytes", "ORBIT_JSON_BODY_LIMIT_BYTES", int),
            ("reconcile_interval_s", "ORBIT_RECONCILE_INTERVAL_S", float),
            ("telemetry", "ORBIT_TELEMETRY", str),
            ("load_history_hours", "ORBIT_LOAD_HISTORY_HOURS", float),
            ("autoscale_interval_s", "ORBIT_AUTOSCALE_INTERVAL_S", float),
            ("queue_capacity_msgs_per_s", "ORBIT_QUEUE_CAPACITY_MSGS_PER_S", float),
            ("scale_window_s", "ORBIT_SCALE_WINDOW_S", float),
            ("scale_down_after_s", "ORBIT_SCALE_DOWN_AFTER_S", float),
        ):
            if env.get(var):
                try:
                    values[name] = kind(env[var])
                except ValueError:
                    raise SettingsError(f"{var}={env[var]!r} is not a valid {kind.__name__}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        key_file = master_key_file or env.get("ORBIT_MASTER_KEY_FILE")
        if master_key_file:
            key = MasterKey.from_file(master_key_file, create=create_master_key)
        elif env.get("ORBIT_MASTER_KEY"):
            key = MasterKey.from_base64(env["ORBIT_MASTER_KEY"])
        elif key_file:
            key = MasterKey.from_file(key_file, create=create_master_key)
        else:
            raise SettingsError(
                "no master key: set ORBIT_MASTER_KEY or ORBIT_MASTER_KEY_FILE, or pass --master-key-file"
            )
        try:
            return cls(master_key=key, **values)  # type: ignore[arg-type]
        except TypeError as e:
            raise SettingsError(str(e)) from None
