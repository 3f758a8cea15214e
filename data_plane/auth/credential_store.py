"""CredentialStore: the broker's copy of the access keys the control plane issued.

access key → (tenant, role, grants, secret key, status). The control plane's reconciler sends
a full snapshot with a version (``replace_all(snapshot, version)``); an older or equal version
is ignored, so replays are harmless. The store swaps its table in one assignment (readers on the
event loop never see half a snapshot) and persists it, so a restarted broker serves with its last
known state while the control plane is away. Unknown, revoked and invalid keys are refused.

The file is encrypted at rest (AES-256-GCM, ``SealedFile`` of data_plane/auth/files.py) with a key
from a 0600 key file created when missing::

    ┌──────────────┬────────────┬────────────────────────────────────────────────┐
    │ "ORBCRED1" 8 │ nonce 12   │ AES-GCM(JSON CredentialSnapshot) + 16-byte tag │
    └──────────────┴────────────┴────────────────────────────────────────────────┘
      the magic is the cipher's associated data; writes are atomic (tmp, fsync, rename, fsync dir)

A file that does not decrypt (another key, tampering) is not used: the store starts empty and
refuses every access key until the reconciler sends a snapshot (fail closed), and says so in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypedDict

import orjson

from data_plane.auth.files import SealedFile, SealedFileError
from data_plane.auth.principal import AuthConfigError, GrantDict, Principal, parse_grants

log = logging.getLogger(__name__)

MAGIC: Final = b"ORBCRED1"
STATUS_ACTIVE: Final = "active"
STATUS_REVOKED: Final = "revoked"


class CredentialEntry(TypedDict):
    """One access key as the control plane sends it."""

    access_key: str
    tenant: str  # "*" for roles operator and broker
    role: str  # "tenant" | "operator" | "broker"
    grants: list[GrantDict]
    secret: str  # the SecretKey clients sign with; "" once revoked
    status: str  # "active" | "revoked"


class CredentialSnapshot(TypedDict):
    """The whole table at one version (also the file's plaintext)."""

    version: int
    credentials: list[CredentialEntry]


class Credential:
    """One usable access key. The secret never appears in ``repr``."""

    __slots__ = ("access_key", "principal", "secret", "status")

    def __init__(self, access_key: str, secret: str, status: str, principal: Principal) -> None:
        self.access_key = access_key
        self.secret = secret
        self.status = status
        self.principal = principal

    @property
    def active(self) -> bool:
        return self.status == STATUS_ACTIVE

    def __repr__(self) -> str:
        return f"Credential(access_key={self.access_key!r}, status={self.status!r}, principal={self.principal!r})"


class CredentialStoreError(Exception):
    """The store's file could not be read or written."""


def _credential(e: Mapping[str, Any]) -> Credential:
    ak = e.get("access_key")
    sk = e.get("secret")
    if not isinstance(ak, str) or not ak or len(ak) > 256:
        raise AuthConfigError("access_key must be a non-empty string of at most 256 characters")
    status = e.get("status")
    if status not in (STATUS_ACTIVE, STATUS_REVOKED):
        raise AuthConfigError(f"access key {ak!r}: status {status!r} is not 'active' or 'revoked'")
    if not isinstance(sk, str) or (not sk and status == STATUS_ACTIVE):
        raise AuthConfigError(f"access key {ak!r}: an active key needs a non-empty secret")
    principal = Principal.build(
        subject=ak,
        tenant=str(e.get("tenant")),
        role=str(e.get("role")),
        grants=parse_grants(e.get("grants", [])),
        source="access_key",
    )
    return Credential(ak, sk, status, principal)


class CredentialStore:
    """``path`` None keeps the store in memory only (tests, auth disabled)."""

    def __init__(self, path: str | None = None, *, key_path: str | None = None) -> None:
        self.path = path
        self.key_path = key_path or (f"{path}.key" if path else None)
        self.version = -1  # no snapshot yet
        self.generation = 0  # bumped on every change of the table (the authorizer drops its caches)
        self.rejected: list[str] = []  # access keys of the last snapshot that were invalid
        self._table: dict[str, Credential] = {}
        self._entries: list[CredentialEntry] = []
        self._file = SealedFile(path, self.key_path, MAGIC) if path and self.key_path else None

    def __len__(self) -> int:
        return len(self._table)

    def lookup(self, access_key: str) -> Credential | None:
        """The access key's credential (active or revoked), or None when unknown."""
        return self._table.get(access_key)

    def access_keys(self) -> list[str]:
        return sorted(self._table)

    # --- snapshots ---------------------------------------------------------------------------
    def _install(self, entries: Iterable[Mapping[str, Any]], version: int) -> list[CredentialEntry]:
        table: dict[str, Credential] = {}
        kept: list[CredentialEntry] = []
        rejected: list[str] = []
        duplicates: set[str] = set()
        for e in entries:
            ak = e.get("access_key") if isinstance(e, Mapping) else None
            try:
                cred = _credential(e)
            except (AuthConfigError, TypeError) as err:
                rejected.append(str(ak))
                log.error("credential snapshot v%d: access key %r refused: %s", version, ak, err)
                continue
            if cred.access_key in table:
                duplicates.add(cred.access_key)
            table[cred.access_key] = cred
            kept.append(_entry_of(e))
        for ak in duplicates:  # ambiguous: refuse the key rather than guess which copy is meant
            log.error("credential snapshot v%d: access key %r appears more than once; refused", version, ak)
            del table[ak]
            rejected.append(ak)
        kept = [e for e in kept if e["access_key"] not in duplicates]
        self._table = table  # one assignment: readers see the old table or the new one
        self._entries = kept
        self.version = version
        self.rejected = rejected
        self.generation += 1
        return kept

    def replace_all(self, snapshot: Iterable[CredentialEntry], version: int, *, force: bool = False) -> bool:
        """Install a full snapshot and persist it. Ignored (False) when ``version`` is not newer
        than the store's, unless ``force`` (a control plane restored from an older backup)."""
        if version <= self.version and not force:
            return False
        kept = self._install(snapshot, version)
        self._persist({"version": version, "credentials": kept})
        return True

    async def apply(self, snapshot: Iterable[CredentialEntry], version: int, *, force: bool = False) -> bool:
        """``replace_all`` for the event loop: the table changes at once, the file is written in
        a worker thread."""
        if version <= self.version and not force:
            return False
        kept = self._install(snapshot, version)
        await asyncio.to_thread(self._persist, {"version": version, "credentials": kept})
        return True

    def snapshot(self) -> CredentialSnapshot:
        return {"version": self.version, "credentials": list(self._entries)}

    # --- the file ----------------------------------------------------------------------------
    def _persist(self, doc: CredentialSnapshot) -> None:
        if self._file is None:
            return
        try:
            self._file.write(orjson.dumps(doc))
        except OSError as e:
            raise CredentialStoreError(f"cannot write credential store {self.path}: {e}") from e

    def load(self) -> bool:
        """Load the persisted snapshot; False when there is none or it cannot be used (logged)."""
        if self._file is None:
            return False
        try:
            plain = self._file.read()
        except SealedFileError as e:
            log.error("credential store: %s; starting empty", e)
            return False
        if plain is None:
            return False
        try:
            doc = orjson.loads(plain)
            version = int(doc["version"])
            entries = doc["credentials"]
            if not isinstance(entries, list):
                raise TypeError("credentials is not a list")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            log.error("credential store %s holds no snapshot (%s); starting empty", self.path, e)
            return False
        self._install(entries, version)
        log.info("credential store: %d access keys at version %d from %s", len(self._table), version, self.path)
        return True


def _entry_of(e: Mapping[str, Any]) -> CredentialEntry:
    return {
        "access_key": e["access_key"],
        "tenant": e["tenant"],
        "role": e["role"],
        "grants": list(e.get("grants", [])),
        "secret": e["secret"],
        "status": e["status"],
    }
