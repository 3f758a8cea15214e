"""data_plane/auth/credential_store.py: snapshots from the control plane, versions, and the
encrypted file that lets a restarted broker serve with its last known credentials."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from data_plane.auth.credential_store import MAGIC, CredentialEntry, CredentialStore
from data_plane.auth.files import KeyFileError, load_or_create_key

SECRET = "sk-very-secret-value-1234"


def entry(ak: str = "AK1", **over: Any) -> CredentialEntry:
    e: dict[str, Any] = {
        "access_key": ak,
        "tenant": "acme",
        "role": "tenant",
        "grants": [{"resource": "topic", "pattern": "*", "actions": ["publish"]}],
        "secret": SECRET,
        "status": "active",
    }
    e.update(over)
    return e  # type: ignore[return-value]


def test_lookup_after_a_snapshot() -> None:
    store = CredentialStore()
    assert store.replace_all([entry("AK1"), entry("AK2", tenant="beta", status="revoked", secret="")], 5)
    a = store.lookup("AK1")
    assert a is not None
    assert a.active
    assert a.secret == SECRET
    assert a.principal.tenant == "acme"
    assert a.principal.allows("topic", "x", "publish")
    b = store.lookup("AK2")
    assert b is not None
    assert not b.active
    assert store.lookup("AK3") is None
    assert store.version == 5
    assert len(store) == 2


def test_older_or_equal_versions_are_ignored_unless_forced() -> None:
    store = CredentialStore()
    store.replace_all([entry("AK1")], 5)
    assert not store.replace_all([entry("AK2")], 5)
    assert not store.replace_all([entry("AK2")], 4)
    assert store.access_keys() == ["AK1"]
    assert store.replace_all([entry("AK2")], 3, force=True)
    assert store.access_keys() == ["AK2"]
    assert store.version == 3


def test_a_new_snapshot_replaces_the_whole_table() -> None:
    store = CredentialStore()
    store.replace_all([entry("AK1"), entry("AK2")], 1)
    g = store.generation
    store.replace_all([entry("AK2", status="revoked", secret="")], 2)
    assert store.lookup("AK1") is None
    cred = store.lookup("AK2")
    assert cred is not None
    assert not cred.active
    assert store.generation == g + 1


@pytest.mark.parametrize(
    "bad",
    [
        {"tenant": "Bad_Tenant"},
        {"role": "root"},
        {"role": "operator"},  # operators have tenant "*"
        {"status": "paused"},
        {"secret": ""},  # active with no secret
        {"grants": [{"resource": "topic", "pattern": "acme%x", "actions": ["publish"]}]},
        {"access_key": ""},
    ],
)
def test_invalid_entries_are_refused_and_the_rest_kept(bad: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    store = CredentialStore()
    with caplog.at_level(logging.ERROR):
        store.replace_all([entry("GOOD"), entry("BAD", **bad)], 1)
    assert store.lookup("GOOD") is not None
    assert store.lookup("BAD") is None
    assert store.rejected == [bad.get("access_key", "BAD")]
    assert SECRET not in caplog.text


def test_duplicate_access_keys_are_refused_entirely() -> None:
    store = CredentialStore()
    store.replace_all([entry("AK1"), entry("AK1", tenant="beta"), entry("AK2")], 1)
    assert store.lookup("AK1") is None
    assert store.access_keys() == ["AK2"]


def test_secrets_stay_out_of_reprs() -> None:
    store = CredentialStore()
    store.replace_all([entry("AK1")], 1)
    cred = store.lookup("AK1")
    assert SECRET not in repr(cred)
    assert SECRET not in str(cred)


# --- the file -----------------------------------------------------------------------------------
def test_the_snapshot_survives_a_restart_encrypted(tmp_path: Path) -> None:
    path = tmp_path / "auth" / "credentials.bin"
    store = CredentialStore(str(path))
    store.replace_all([entry("AK1"), entry("AK2", status="revoked", secret="")], 7)
    raw = path.read_bytes()
    assert raw.startswith(MAGIC)
    assert SECRET.encode() not in raw
    assert b"access_key" not in raw
    assert b'"tenant"' not in raw
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key_path = Path(f"{path}.key")
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    assert len(key_path.read_bytes()) == 32

    again = CredentialStore(str(path))
    assert again.load()
    assert again.version == 7
    cred = again.lookup("AK1")
    assert cred is not None
    assert cred.secret == SECRET
    assert cred.principal.tenant == "acme"
    revoked = again.lookup("AK2")
    assert revoked is not None
    assert not revoked.active
    assert again.snapshot() == store.snapshot()
    assert not list(tmp_path.glob("auth/*.tmp"))


def test_each_write_uses_a_fresh_nonce(tmp_path: Path) -> None:
    path = tmp_path / "credentials.bin"
    store = CredentialStore(str(path))
    store.replace_all([entry()], 1)
    first = path.read_bytes()
    store.replace_all([entry()], 1, force=True)
    assert path.read_bytes() != first


def test_a_tampered_file_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "credentials.bin"
    CredentialStore(str(path)).replace_all([entry()], 1)
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 0x01
    path.write_bytes(bytes(raw))
    again = CredentialStore(str(path))
    with caplog.at_level(logging.ERROR):
        assert not again.load()
    assert "tampered" in caplog.text
    assert again.lookup("AK1") is None
    assert again.version == -1


def test_a_file_sealed_with_another_key_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "credentials.bin"
    CredentialStore(str(path), key_path=str(tmp_path / "a.key")).replace_all([entry()], 1)
    other = CredentialStore(str(path), key_path=str(tmp_path / "b.key"))
    assert not other.load()
    assert other.lookup("AK1") is None


def test_a_missing_or_foreign_file_starts_empty(tmp_path: Path) -> None:
    assert not CredentialStore(str(tmp_path / "none.bin")).load()
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello world, not ours at all")
    assert not CredentialStore(str(junk)).load()


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    load_or_create_key(str(key))
    os.chmod(key, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_or_create_key(str(key))


def test_a_key_file_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    key.write_bytes(b"short")
    os.chmod(key, 0o600)
    with pytest.raises(KeyFileError, match="5 bytes"):
        load_or_create_key(str(key))


def test_the_key_file_is_reused(tmp_path: Path) -> None:
    key = str(tmp_path / "k.key")
    assert load_or_create_key(key) == load_or_create_key(key)


@pytest.mark.asyncio
async def test_apply_swaps_at_once_and_persists_off_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "credentials.bin"
    store = CredentialStore(str(path))
    task = asyncio.create_task(store.apply([entry("AK9")], 3))
    await task
    assert task.result() is True
    assert store.lookup("AK9") is not None
    again = CredentialStore(str(path))
    assert again.load()
    assert again.lookup("AK9") is not None
    assert not await store.apply([entry("AK8")], 2)
