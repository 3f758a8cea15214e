"""Helpers the integration tests share (fixtures are in ``conftest.py``):

- ``until``: poll a condition (sync or async) until it holds, or fail naming it;
- ``Clock``: an injected clock (seconds) the test moves by setting ``t``;
- ``serve_app``: an aiohttp app on 127.0.0.1 port 0 (fake token endpoints, JWKS servers);
- ``orbit``: the ``orbit`` command line (``python -m data_plane.cli``) run to completion;
  ``start_dev_up``: ``orbit dev up`` started and serving;
- ``create_topic`` and ``QUICK``: SDK clients against a real name server and broker;
- ``NO_DISK_POLICY``: broker flags that turn the disk-space refusals off.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sdk import ConsumeResult, MessageExt, Producer, PushConsumer

DEADLINE_S = 20.0
# Broker flags: no DISK_FULL refusals while the shared test disk is busy (disk policy is not what
# these tests are about).
NO_DISK_POLICY = [
    "--store-set",
    "disk_max_used_space_ratio=0.99",
    "--store-set",
    "disk_space_clean_forcibly_ratio=1.0",
    "--store-set",
    "disk_space_warning_level_ratio=1.0",
]
# Push-consumer options: short periods, so membership changes settle in about a second.
QUICK: dict[str, Any] = {
    "heartbeat_interval_ms": 1000,
    "rebalance_interval_ms": 1000,
    "persist_interval_ms": 500,
    "consume_from": "FIRST_OFFSET",
}


async def until(
    cond: Callable[[], object | Awaitable[object]],
    what: str = "condition",
    timeout_s: float = DEADLINE_S,
    every_s: float = 0.02,
) -> None:
    """Poll ``cond`` (sync or async) every ``every_s`` until its answer is true (truthy); fail
    naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = cond()
        if inspect.isawaitable(r):
            r = await r
        if r:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


class Clock:
    """An injected clock in seconds; the test moves it by setting ``t``."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 port 0; yields its base URL (``http://127.0.0.1:<port>``)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def orbit(
    env: Mapping[str, str], *args: str, stdin: str | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``orbit *args`` in the environment ``env``, run to completion; its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "data_plane.cli", *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )


def stop_dev_up(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C for ``orbit dev up`` (started by ``start_dev_up``), and its end awaited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    else:
        proc.communicate()


def start_dev_up(
    data_dir: Path, ready: Path, *flags: str, timeout_s: float
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start ``orbit dev up`` (ports 0, small store files, ``flags``) and wait until it wrote its
    ready file ``ready``: the process (output piped, stopped by the caller) and the ready file's
    content. A process that exits or does not come up within ``timeout_s`` fails the test."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "data_plane.cli",
            "dev",
            "up",
            "--dir",
            str(data_dir),
            "--namesrv-port",
            "0",
            "--broker-port",
            "0",
            *flags,
            "--ready-file",
            str(ready),
            # Small files: every test's store would otherwise reserve a 1 GiB CommitLog file.
            "--store-set",
            "commit_log_file_size_bytes=16777216",
            "--store-set",
            "reserve_ahead_bytes=0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "orbit dev up did not come up"
            time.sleep(0.05)
        return proc, json.loads(ready.read_text())
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        raise


async def create_topic(namesrv_addr: str, topic: str, queues: int) -> None:
    """Create ``topic`` with ``queues`` queues through an SDK producer's admin request."""
    async with Producer("admin", namesrv_addrs=namesrv_addr, instance_name="admin") as p:
        await p.create_topic(topic, queue_nums=queues)


def collecting(
    group: str, namesrv_addr: str, topic: str, name: str, expression: str = "*", **options: Any
) -> tuple[PushConsumer, list[MessageExt]]:
    """A push consumer (``QUICK`` options, then ``options``) whose concurrent listener appends
    every message to the returned list."""
    c = PushConsumer(group, namesrv_addrs=namesrv_addr, instance_name=name, **{**QUICK, **options})
    c.subscribe(topic, expression)
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        got.extend(msgs)
        return ConsumeResult.SUCCESS

    c.on_message(listener)
    return c, got
