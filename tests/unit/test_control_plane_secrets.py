"""Secrets at rest: AES-GCM sealing, scrypt hashes, the master key and the settings object."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from control_plane.sealing import Sealer, SealError
from control_plane.secret_hash import hash_secret, verify_secret
from control_plane.settings import MasterKey, Settings, SettingsError, write_private_file


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


def test_a_private_file_is_replaced_whole_and_stays_0600(tmp_path: Path) -> None:
    """A reader that opened the old file keeps reading the old content (the new one was renamed
    over it, not written into it); the new file is 0600 and no temporary file is left."""
    path = tmp_path / "run" / "control-plane.ready"
    write_private_file(str(path), '{"url": "http://127.0.0.1:1"}\n')
    with open(path) as old:
        write_private_file(str(path), '{"url": "http://127.0.0.1:2"}\n')
        assert old.read() == '{"url": "http://127.0.0.1:1"}\n'
    assert path.read_text() == '{"url": "http://127.0.0.1:2"}\n'
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["control-plane.ready"]


def test_a_private_file_that_cannot_be_written_leaves_the_old_one_and_no_litter(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    write_private_file(str(path), "old\n")
    with pytest.raises(TypeError):
        write_private_file(str(path), b"not text")  # type: ignore[arg-type]
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["creds.json"]


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
