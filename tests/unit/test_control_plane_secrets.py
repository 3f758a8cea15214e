"""Secrets at rest: AES-GCM sealing, scrypt hashes, the master key and the settings object."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from control_plane.sealing import Sealer, SealError
from control_plane.secret_hash import hash_secret, verify_secret
from control_plane.settings import MasterKey, Settings, SettingsError


def key() -> MasterKey:
    return MasterKey(os.urandom(32))


def test_sealed_secrets_open_only_with_their_key_and_context() -> None:
    k = key()
    sealer = Sealer(k)
    sealed = sealer.seal(b"s3cret", context=b"credential:AK1")
    assert b"s3cret" not in sealed
    assert sealer.open(sealed, context=b"credential:AK1") == b"s3cret"
    with pytest.raises(SealError):
        sealer.open(sealed, context=b"credential:AK2")
    with pytest.raises(SealError):
        Sealer(key()).open(sealed, context=b"credential:AK1")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealError):
        sealer.open(tampered, context=b"credential:AK1")


def test_secret_hashes_are_salted_and_verify() -> None:
    a, b = hash_secret("correct horse", log2_n=10), hash_secret("correct horse", log2_n=10)
    assert a != b
    assert "correct horse" not in a
    assert verify_secret("correct horse", a)
    assert not verify_secret("correct horsE", a)
    assert not verify_secret("x", "not-a-hash")


def test_master_key_file_is_created_0600_and_read_back(tmp_path: Path) -> None:
    path = str(tmp_path / "keys" / "master.key")
    made = MasterKey.from_file(path, create=True)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert MasterKey.from_file(path) == made
    assert "hidden" in repr(made)
    assert base64.b64encode(made.value).decode() not in repr(made)


def test_settings_come_from_env_then_flags() -> None:
    k = base64.b64encode(os.urandom(32)).decode()
    env = {"ORBIT_MASTER_KEY": k, "DATABASE_URL": "postgresql://u:pw@h/db", "ORBIT_TOKEN_LIFETIME_S": "600"}
    s = Settings.from_env(env, listen="127.0.0.1:0")
    assert (s.listen_port, s.token_lifetime_s, s.database_url) == (0, 600, "postgresql://u:pw@h/db")
    assert "pw" not in repr(s)
    with pytest.raises(SettingsError, match="master key"):
        Settings.from_env({})
    with pytest.raises(SettingsError, match="32 bytes"):
        Settings.from_env({"ORBIT_MASTER_KEY": base64.b64encode(b"short").decode()})
    with pytest.raises(SettingsError, match="listen"):
        Settings.from_env(env, listen="nowhere")
    with pytest.raises(SettingsError, match="ORBIT_TOKEN_LIFETIME_S"):
        Settings.from_env({**env, "ORBIT_TOKEN_LIFETIME_S": "soon"})
