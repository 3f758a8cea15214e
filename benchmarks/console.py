"""The web console's time to first byte with many topics in a tenant: a real control plane on an
embedded PostgreSQL (fsync off), one tenant with ``--topics`` topics (and as many queues as
they take), signed in through the console's own form; then each page is fetched ``--requests``
times in a row and the time from sending the request to the response's headers is taken (the
page is rendered whole before its first byte leaves). Pages that need the brokers (lag,
message search, dead letters) are left out: their time is the brokers' round trips; the fleet
page is measured with its name server refusing at once.

    python -m benchmarks.console [--topics 1000] [--requests 30] [--out FILE|DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from benchmarks.machine import python_loop_ns
from benchmarks.output import emit, header, result_path
from control_plane.app import create_app
from control_plane.postgres import EmbeddedPostgres
from control_plane.settings import MasterKey, Settings

TENANT = "bench"
TARGET_MS = 100.0
CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
PAGES = [
    f"/console/t/{TENANT}/topics",
    f"/console/t/{TENANT}/topics/topic-0500",
    f"/console/t/{TENANT}/groups",
    f"/console/t/{TENANT}/messages",
    f"/console/t/{TENANT}/credentials",
    f"/console/t/{TENANT}/usage",
    "/console/ops/tenants",
    f"/console/ops/tenants/{TENANT}",
    "/console/ops/plans",
    "/console/ops/fleet",
    "/console/ops/fleet/broker-a",
    "/console/ops/credentials",
]
OPERATOR_PAGES = ("/console/ops/", f"/console/t/{TENANT}/topics/")


async def _api(session: aiohttp.ClientSession, method: str, url: str, token: str, body: Any = None) -> Any:
    async with session.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}) as resp:
        data = await resp.read()
        if resp.status >= 300:
            raise SystemExit(f"{method} {url}: HTTP {resp.status}: {data[:300]!r}")
        return orjson.loads(data) if data else None


async def _token(session: aiohttp.ClientSession, url: str, access_key: str, secret: str) -> str:
    form = {"grant_type": "client_credentials", "client_id": access_key, "client_secret": secret}
    async with session.post(url + "/oauth/token", data=form) as resp:
        return str((await resp.json())["access_token"])


async def _sign_in(url: str, access_key: str, secret: str) -> aiohttp.ClientSession:
    console = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with console.get(url + "/console/sign-in") as resp:
        found = CSRF.search(await resp.text())
    assert found is not None
    form = {"client_id": access_key, "client_secret": secret, "csrf": found.group(1), "next": "/console/"}
    async with console.post(url + "/console/sign-in", data=form, allow_redirects=False) as resp:
        if resp.status != 303:
            raise SystemExit(f"signing in: HTTP {resp.status}")
    return console


async def _first_byte_ms(session: aiohttp.ClientSession, url: str, requests: int) -> dict[str, Any]:
    times: list[float] = []
    size = 0
    for i in range(requests + 3):  # 3 to warm up
        began = time.perf_counter()
        async with session.get(url, allow_redirects=False) as resp:
            first = time.perf_counter()  # the status line and headers are in
            body = await resp.read()
            if resp.status != 200:
                raise SystemExit(f"GET {url}: HTTP {resp.status}: {body[:300]!r}")
        if i >= 3:
            times.append((first - began) * 1000)
            size = len(body)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
        "max_ms": round(times[-1], 1),
        "bytes": size,
    }


async def run(topics: int, requests: int, workdir: Path) -> dict[str, Any]:
    pg_dir = tempfile.mkdtemp(prefix="orbit-console-bench-pg-")  # (PostgreSQL's user must enter it)
    pg = EmbeddedPostgres(pg_dir, durable=False)
    pg.start()
    runner: web.AppRunner | None = None
    try:
        dsn = pg.create_database("orbit_console_bench")
        settings = Settings(
            master_key=MasterKey(secrets.token_bytes(32)),
            database_url=dsn,
            listen="127.0.0.1:0",
            bootstrap_credentials_file=str(workdir / "operator.json"),
            reconcile_interval_s=0,
        )
        runner = web.AppRunner(create_app(settings))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        operator = orjson.loads((workdir / "operator.json").read_bytes())
        async with aiohttp.ClientSession() as api:
            op = await _token(api, url, operator["access_key"], operator["secret"])
            closed = f"127.0.0.1:{_closed_port()}"  # the fleet page's name server: refuses at once
            group = {"name": "broker-a", "namesrv_addrs": [closed], "broker_addrs": [closed],
                     "max_queues": 1_000_000, "max_msgs_per_s": 1_000_000, "storage_bytes": 1 << 40}  # fmt: skip
            await _api(api, "POST", url + "/v1/fleet/broker-groups", op, group)
            await _api(api, "POST", url + "/v1/tenants", op, {"id": TENANT, "plan": "standard"})
            limits = {"max_topics": topics + 10, "max_queues": 4 * topics + 40}
            await _api(api, "PUT", f"{url}/v1/tenants/{TENANT}/quota", op, limits)
            made = await _api(api, "POST", f"{url}/v1/tenants/{TENANT}/credentials", op, {})
            sem = asyncio.Semaphore(8)

            async def create(i: int) -> None:
                async with sem:
                    await _api(api, "POST", f"{url}/v1/tenants/{TENANT}/topics", op, {"name": f"topic-{i:04d}"})

            began = time.perf_counter()
            await asyncio.gather(*(create(i) for i in range(topics)))
            setup_s = time.perf_counter() - began
            for i in range(10):
                await _api(api, "POST", f"{url}/v1/tenants/{TENANT}/groups", op, {"name": f"group-{i}"})
        tenant = await _sign_in(url, made["access_key"], made["secret"])
        ops = await _sign_in(url, operator["access_key"], operator["secret"])
        pages: dict[str, Any] = {}
        try:
            for page in PAGES:
                session = ops if page.startswith("/console/ops/") else tenant
                pages[page] = await _first_byte_ms(session, url + page, requests)
        finally:
            await tenant.close()
            await ops.close()
        worst = max(p["p95_ms"] for p in pages.values())
        return {"topics": topics, "requests_per_page": requests, "topics_created_s": round(setup_s, 1),
                "pages": pages, "worst_p95_ms": worst, "target_ms": TARGET_MS, "met": worst <= TARGET_MS}  # fmt: skip
    finally:
        if runner is not None:
            await runner.cleanup()
        pg.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.console", description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", type=int, default=1000, help="topics in the tenant (default 1000)")
    p.add_argument("--requests", type=int, default=30, help="timed requests per page (default 30)")
    p.add_argument("--out", help="also write the JSON here (a directory: a file named after the run)")
    args = p.parse_args(argv)
    if args.topics < 1 or args.requests < 1:
        p.error("--topics and --requests must be at least 1")
    with tempfile.TemporaryDirectory(prefix="orbit-console-bench-") as tmp:
        figures = asyncio.run(run(args.topics, args.requests, Path(tmp)))
    machine = {"cpus": os.cpu_count(), "python_loop_ns": round(python_loop_ns(), 2)}
    result = {**header("console", argv), "machine": machine, **figures}
    emit(result, result_path(args.out, "console"))
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
