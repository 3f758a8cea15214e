"""The HA link's secret on a broker: where it comes from and how it is kept (docs/ha.md, "The HA link").

    ha_secret_file set ──▶ that file's content (mode 0600 or stricter; read at start)
    else auth_enabled  ──▶ the control plane's, from ORBIT_SYNC_TENANCY ("ha_secret", base64:
                           HMAC-SHA256 of its master key over "orbit-ha-link:" + group), kept
                           sealed in <store_dir>/config/auth/ha-link.bin (AES-256-GCM, the key
                           file of the credential store) so a restarted broker links without it
    else               ──▶ no secret: the link is not authenticated (the single-tenant,
                           RocketMQ-compatible mode)

With a secret required but not known yet (auth on, nothing from the control plane so far), a
master accepts no slave and a slave does not connect; both say so once. The secret is never
logged, and ``repr`` does not show it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import stat
from collections.abc import Callable

from data_plane.auth import AuthConfig
from data_plane.auth.files import SealedFile, SealedFileError
from data_plane.broker.config import BrokerConfig, ConfigError
from data_plane.store.ha.protocol import LinkAuth

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
SEALED_MAGIC = b"ORBHALK1"
SOURCE_FILE = "ha_secret_file"
SOURCE_CONTROL_PLANE = "control plane"


def read_secret_file(path: str) -> bytes:
    """The secret in ``path``: its bytes without surrounding whitespace (16..4096 of them).
    ConfigError when it cannot be read, or when group or others may access it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ConfigError(f"ha_secret_file {path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"ha_secret_file {path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
            )
        raw = os.read(fd, MAX_SECRET_BYTES + 64)
    finally:
        os.close(fd)
    secret = raw.strip()
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"ha_secret_file {path} must hold {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes "
            "(e.g. the output of `openssl rand -base64 32`)"
        )
    return secret


def decode_ha_secret(value: object) -> bytes:
    """The secret in a tenancy snapshot's ``ha_secret`` (base64); ValueError when it is not one
    (the message never shows the value)."""
    if not isinstance(value, str):
        raise ValueError("ha_secret must be a base64 string")
    try:
        secret = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("ha_secret is not valid base64") from None
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ValueError(f"ha_secret must decode to {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
    return secret


class LinkSecret:
    """One broker's HA link secret: ``auth()`` for the HA service and client, ``update()`` with
    the control plane's."""

    def __init__(self, config: BrokerConfig) -> None:
        self.group = config.broker_name
        self.file_path = config.ha_secret_file
        self.auth_timeout_ms = config.ha_auth_timeout_ms
        # Told when the secret changes (a slave waiting for one connects at once).
        self.on_change: Callable[[], None] | None = None
        self._secret: bytes | None = read_secret_file(self.file_path) if self.file_path else None
        self._sealed: SealedFile | None = None
        self._ignored_said = False
        if not self.file_path and config.auth_enabled:
            paths = AuthConfig.for_store_dir(config.store_dir)
            sealed_path = os.path.join(os.path.dirname(paths.credential_store_path), "ha-link.bin")
            self._sealed = SealedFile(sealed_path, paths.credential_key_path, SEALED_MAGIC)

    def __repr__(self) -> str:
        return f"LinkSecret(group={self.group!r}, source={self.source!r}, known={self._secret is not None})"

    @property
    def required(self) -> bool:
        """Whether the link is authenticated (an ha_secret_file, or auth on)."""
        return bool(self.file_path) or self._sealed is not None

    @property
    def source(self) -> str:
        if self.file_path:
            return SOURCE_FILE
        return SOURCE_CONTROL_PLANE if self._sealed is not None else "none"

    def current(self) -> bytes | None:
        return self._secret

    def auth(self) -> LinkAuth | None:
        """What the HA service and client authenticate with; None: an unauthenticated link."""
        if not self.required:
            return None
        return LinkAuth(self.group, self.current, self.auth_timeout_ms)

    def status(self) -> str:
        """For the runtime info: how the link authenticates now."""
        if not self.required:
            return "off"
        return self.source if self._secret is not None else "waiting for the control plane"

    def load(self) -> None:
        """The control plane's secret as this broker last kept it (none, or one that cannot be
        used: logged, and the broker waits for the control plane's next sync)."""
        if self._sealed is None:
            return
        try:
            secret = self._sealed.read()
        except SealedFileError as e:
            log.error("HA link secret: %s; waiting for the control plane's", e)
            return
        if secret is not None and MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
            self._secret = secret
            log.info("HA link secret of group %s loaded (kept from the control plane)", self.group)

    async def update(self, secret: bytes) -> bool:
        """The control plane's secret (ORBIT_SYNC_TENANCY): kept sealed, used from the next
        connection on. False when unchanged, or when ha_secret_file is the source."""
        if self._sealed is None:
            if self.file_path and not self._ignored_said:
                self._ignored_said = True
                log.info("HA link: the control plane's secret is not used (ha_secret_file is set)")
            return False
        if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
            raise ValueError(f"ha_secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
        if secret == self._secret:
            return False
        await asyncio.to_thread(self._sealed.write, secret)
        first = self._secret is None
        self._secret = secret
        log.info("HA link secret of group %s %s from the control plane", self.group, "received" if first else "changed")
        if self.on_change is not None:
            self.on_change()
        return True
