"""EmbeddedPostgres's binary discovery (no server started here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from control_plane import postgres
from control_plane.postgres import (
    EmbeddedPostgresError,
    fallback_data_dir,
    has_server_binaries,
    sweep_orphaned_fallbacks,
    system_bin_dirs,
)

pytestmark = pytest.mark.unit


def fake_bin(path: Path, names: tuple[str, ...] = ("initdb", "postgres", "pg_isready")) -> Path:
    path.mkdir(parents=True)
    for name in names:
        exe = path / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return path


def test_a_bin_dir_needs_initdb_postgres_and_pg_isready(tmp_path: Path) -> None:
    assert has_server_binaries(str(fake_bin(tmp_path / "full")))
    assert not has_server_binaries(str(fake_bin(tmp_path / "client-only", ("psql", "pg_isready"))))
    assert not has_server_binaries(str(tmp_path / "missing"))


def test_pg_config_comes_first_then_the_newest_versioned_dir(tmp_path: Path) -> None:
    from_config = fake_bin(tmp_path / "custom" / "bin")
    pg_config = tmp_path / "pg_config"
    pg_config.write_text(f"#!/bin/sh\necho {from_config}\n")
    pg_config.chmod(0o755)
    for version in ("9.6", "15", "13"):
        fake_bin(tmp_path / "lib" / version / "bin")
    (tmp_path / "lib" / "16" / "bin").mkdir(parents=True)  # no binaries: skipped
    found = system_bin_dirs(pg_config=str(pg_config), pattern=str(tmp_path / "lib" / "*" / "bin"))
    assert found[:4] == [
        str(from_config),
        str(tmp_path / "lib" / "15" / "bin"),
        str(tmp_path / "lib" / "13" / "bin"),
        str(tmp_path / "lib" / "9.6" / "bin"),
    ]


def test_a_broken_pg_config_is_skipped(tmp_path: Path) -> None:
    pg_config = tmp_path / "pg_config"
    pg_config.write_text("#!/bin/sh\nexit 3\n")
    pg_config.chmod(0o755)
    fake_bin(tmp_path / "lib" / "14" / "bin")
    found = system_bin_dirs(pg_config=str(pg_config), pattern=str(tmp_path / "lib" / "*" / "bin"))
    assert found[0] == str(tmp_path / "lib" / "14" / "bin")


def test_without_system_binaries_the_pypi_package_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Discovery only: point the search at nothing and say the package is absent.
    monkeypatch.setattr(postgres, "system_bin_dirs", list)
    monkeypatch.setattr(postgres, "PYPI_MODULE", "orbit_no_such_pg_package")
    assert postgres.pypi_bin_dir() is None
    with pytest.raises(EmbeddedPostgresError, match=r"no PostgreSQL binaries .*\(scripts/venv\.sh postgres\)"):
        postgres.find_bin_dir()
    package = tmp_path / "site" / "orbit_fake_pg"
    fake_bin(package / "pginstall" / "bin")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(postgres, "PYPI_MODULE", "orbit_fake_pg")
    assert postgres.find_bin_dir() == str(package / "pginstall" / "bin")


def test_the_fallback_data_dir_is_kept_by_its_data_dir_and_not_inherited_by_a_new_one(tmp_path: Path) -> None:
    root = tmp_path / "var"
    root.mkdir()
    data = tmp_path / "cp" / "postgres"
    first = fallback_data_dir(data, root=root)
    assert first.parent == root
    assert first.name.startswith("orbit-postgres-")
    assert first.is_dir()
    assert fallback_data_dir(str(data), root=root) == first  # a restart finds its database again
    assert fallback_data_dir(tmp_path / "other", root=root) != first
    (first / "pgdata").mkdir()
    (first / "pgdata" / "PG_VERSION").write_text("15\n")
    shutil.rmtree(tmp_path / "cp")  # the data dir goes; a new one appears at the same path
    second = fallback_data_dir(data, root=root)
    assert second != first
    assert not (second / "pgdata").exists()
    assert not first.exists()  # the orphan was swept


def test_the_sweep_spares_running_servers_and_directories_without_an_owner(tmp_path: Path) -> None:
    root = tmp_path / "var"
    root.mkdir()
    legacy = root / "orbit-postgres-legacy"
    (legacy / "pgdata").mkdir(parents=True)
    running = fallback_data_dir(tmp_path / "gone-running", root=root)
    (running / "pgdata").mkdir()
    (running / "pgdata" / "postmaster.pid").write_text(f"{os.getpid()}\n/some/dir\n")
    dead = fallback_data_dir(tmp_path / "gone-dead", root=root)
    (dead / "pgdata").mkdir()
    (dead / "pgdata" / "postmaster.pid").write_text("999999999\n/some/dir\n")
    kept = fallback_data_dir(tmp_path / "kept", root=root)
    shutil.rmtree(tmp_path / "gone-running")
    shutil.rmtree(tmp_path / "gone-dead")
    assert sweep_orphaned_fallbacks(root) == [dead]
    assert legacy.is_dir()
    assert running.is_dir()
    assert kept.is_dir()
    assert not dead.exists()
