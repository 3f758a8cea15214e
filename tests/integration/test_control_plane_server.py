"""The control-plane process: ``python -m control_plane`` on port 0, found through its ready
file, over the test PostgreSQL or over its own embedded one; SIGTERM stops it cleanly."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = pytest.mark.integration
READY_TIMEOUT_S = 60.0


def start(args: list[str], workdir: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    ready = workdir / "ready.json"
    ready.unlink(missing_ok=True)
    log = open(workdir / "control-plane.log", "wb")  # noqa: SIM115 - the child's stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "ORBIT_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane", "--listen", "127.0.0.1:0", "--ready-file", str(ready), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError((workdir / "control-plane.log").read_text())
        time.sleep(0.05)  # deadline poll for the ready file
    return proc, orjson.loads(ready.read_bytes())["url"], workdir / "control-plane.log"


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


async def exercise(url: str, bootstrap: Path) -> None:
    with open(bootstrap, "rb") as f:  # noqa: ASYNC230 - a tiny local file
        operator = orjson.loads(f.read())
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/healthz") as resp:
            assert resp.status == 200
        basic = base64.b64encode(f"{operator['access_key']}:{operator['secret']}".encode()).decode()
        async with session.post(
            url + "/oauth/token", data={"grant_type": "client_credentials"}, headers={"Authorization": f"Basic {basic}"}
        ) as resp:
            assert resp.status == 200
            token = (await resp.json())["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        async with session.post(url + "/v1/tenants", json={"id": "acme"}, headers=headers) as resp:
            assert resp.status in (201, 409)


async def serve_once(args: list[str], workdir: Path, bootstrap: Path) -> Path:
    """Start the process, exercise it with the operator credential in ``bootstrap``, stop it
    (exit code 0): the process's log."""
    proc, url, log = start(args, workdir)
    try:
        await exercise(url, bootstrap)
    finally:
        assert stop(proc) == 0
    return log


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory the postgres user can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="orbit-cp-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.asyncio
async def test_the_process_serves_over_a_given_database(postgres_dsn: str, tmp_path: Path) -> None:
    bootstrap = tmp_path / "operator.json"
    args = [
        "--database-url",
        postgres_dsn,
        "--master-key-file",
        str(tmp_path / "master.key"),
        "--bootstrap-credentials-file",
        str(bootstrap),
    ]
    log = await serve_once(args, tmp_path, bootstrap)
    secret = orjson.loads(bootstrap.read_bytes())["secret"]
    assert secret not in log.read_text()
    # a restart keeps the state and does not bootstrap a second operator
    proc, url, _ = start(args, tmp_path)
    try:
        await exercise(url, bootstrap)
        assert orjson.loads(bootstrap.read_bytes())["secret"] == secret
    finally:
        assert stop(proc) == 0


@pytest.mark.asyncio
async def test_without_a_database_url_it_runs_an_embedded_postgresql(short_tmp: Path) -> None:
    bootstrap = short_tmp / "operator.json"
    proc, url, log = start(
        ["--data-dir", str(short_tmp / "data"), "--bootstrap-credentials-file", str(bootstrap)], short_tmp
    )
    try:
        await exercise(url, bootstrap)
        assert (short_tmp / "data" / "master.key").exists()
    finally:
        assert stop(proc) == 0
    assert "embedded PostgreSQL" in log.read_text()
    assert not (short_tmp / "data" / "postgres" / "pgdata" / "postmaster.pid").exists()  # stopped with us


@pytest.mark.asyncio
async def test_a_new_data_dir_at_a_used_path_gets_a_fresh_database(tmp_path: Path) -> None:
    """pytest's private tmp dirs (and a fresh clone's) reuse paths. As root the postgres user
    cannot enter them, so the data goes elsewhere; a directory made anew at a used path must
    not inherit the old database, or no operator credential is bootstrapped for it."""
    data, bootstrap = tmp_path / "data", tmp_path / "operator.json"
    args = ["--data-dir", str(data), "--bootstrap-credentials-file", str(bootstrap)]
    await serve_once(args, tmp_path, bootstrap)
    first = orjson.loads(bootstrap.read_bytes())["access_key"]
    shutil.rmtree(data)
    bootstrap.unlink()
    await serve_once(args, tmp_path, bootstrap)  # reads the operator.json this start wrote
    assert orjson.loads(bootstrap.read_bytes())["access_key"] != first
