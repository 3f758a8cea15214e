"""data_plane/tenancy/usage_reporter.py against a stand-in for the control plane's usage endpoint:
a real aiohttp server on 127.0.0.1:0, started here, that records what it receives."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from data_plane.tenancy.metering import MINUTE_MS, UsageMeter, UsageRecord
from data_plane.tenancy.usage_reporter import USAGE_PATH, UsageReporter
from data_plane.tenancy.usage_spool import UsageSpool
from tests.integration import helpers

until = functools.partial(helpers.until, timeout_s=10.0, every_s=0.005)

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS
TOKEN = "broker-token"


class ControlPlane:
    """Accepts POST /internal/v1/usage with the right bearer token; ``fail_next`` answers 503."""

    def __init__(self) -> None:
        self.accepted: list[UsageRecord] = []
        self.attempts = 0
        self.auth_seen: list[str] = []
        self.fail_next = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _usage(self, request: web.Request) -> web.Response:
        self.attempts += 1
        auth = request.headers.get("Authorization", "")
        self.auth_seen.append(auth)
        if auth != f"Bearer {TOKEN}":
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.fail_next:
            self.fail_next -= 1
            return web.json_response({"error": "unavailable"}, status=503)
        body = await request.json()
        self.accepted.extend(body["records"])
        return web.json_response({"accepted": len(body["records"])})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(USAGE_PATH, self._usage)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def accepted_ids(self) -> list[str]:
        return [r["report_id"] for r in self.accepted]


@pytest_asyncio.fixture
async def control_plane() -> AsyncIterator[ControlPlane]:
    cp = ControlPlane()
    await cp.start()
    yield cp
    await cp.stop()


def spool_minutes(
    spool: UsageSpool, broker: str, minutes: range, tenants: tuple[str, ...] = ("acme", "globex")
) -> list[str]:
    """Meter some traffic for each minute and spool the records; their report ids."""
    meter = UsageMeter(broker, spool=spool, clock_ms=lambda: T0 + minutes.start * MINUTE_MS)
    ids: list[str] = []
    for m in minutes:
        for t in tenants:
            meter.record_request(t, 100 * (m + 1), 0)
        records = meter.roll(T0 + (m + 1) * MINUTE_MS)
        spool.append(records)
        ids += [r["report_id"] for r in records]
    return ids


async def async_token() -> str:
    return TOKEN


def reporter_for(spool: UsageSpool, url: str, **kw: object) -> UsageReporter:
    options: dict[str, object] = {
        "token": async_token,
        "batch_records": 3,
        "idle_interval_s": 0.01,
        "backoff_initial_s": 0.001,
        "backoff_max_s": 0.02,
        "backoff_jitter": 0.0,
    }
    options.update(kw)
    return UsageReporter(spool, control_plane_url=url, **options)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_records_are_delivered_in_batches_with_the_bearer_token(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    spool = UsageSpool(str(tmp_path))
    ids = spool_minutes(spool, "broker-a", range(4))
    reporter = reporter_for(spool, control_plane.url + "/", token=lambda: TOKEN)  # a plain callable too
    reporter.start()
    await until(lambda: spool.pending == 0)
    await reporter.stop()
    assert control_plane.accepted_ids() == ids
    assert control_plane.attempts == 3  # 8 records in batches of 3
    assert set(control_plane.auth_seen) == {f"Bearer {TOKEN}"}
    assert control_plane.accepted[0] == {
        "report_id": f"broker-a:{T0}:acme",
        "broker": "broker-a",
        "tenant": "acme",
        "minute": T0,
        "requests_4k": 1,
        "bytes_in": 100,
        "bytes_out": 0,
        "stored_bytes": 0,
    }


@pytest.mark.asyncio
async def test_while_the_control_plane_is_down_records_are_kept_then_delivered_exactly_once(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    await control_plane.stop()  # down: connections are refused
    spool = UsageSpool(str(tmp_path))
    ids = spool_minutes(spool, "broker-a", range(3))
    reporter = reporter_for(spool, control_plane.url)
    reporter.start()
    await until(lambda: reporter.failures >= 5)
    assert spool.pending == len(ids)
    ids += spool_minutes(spool, "broker-a", range(3, 5))  # metering goes on meanwhile
    await control_plane.start()  # back up, same port
    reporter.wake()
    await until(lambda: spool.pending == 0)
    await reporter.stop()
    assert control_plane.accepted_ids() == ids
    assert len(set(control_plane.accepted_ids())) == len(ids) == 10
    assert reporter.consecutive_failures == 0
    assert "ClientConnectorError" in reporter.last_error or "Connect" in reporter.last_error


@pytest.mark.asyncio
async def test_error_answers_are_retried_and_only_accepted_batches_are_acknowledged(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    control_plane.fail_next = 4
    spool = UsageSpool(str(tmp_path))
    ids = spool_minutes(spool, "b", range(2))
    tokens = iter(["stale-token", TOKEN])

    async def token() -> str:
        return next(tokens, TOKEN)

    reporter = reporter_for(spool, control_plane.url, token=token)
    reporter.start()
    await until(lambda: spool.pending == 0)
    await reporter.stop()
    assert control_plane.auth_seen[0] == "Bearer stale-token"  # a 401: asked for a token again
    assert control_plane.attempts == 1 + 4 + 2
    assert control_plane.accepted_ids() == ids
    assert reporter.failures == 5


@pytest.mark.asyncio
async def test_a_broker_restart_resends_what_was_not_acknowledged_and_nothing_else(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    spool = UsageSpool(str(tmp_path))
    delivered_before = spool_minutes(spool, "broker-a", range(2))
    reporter = reporter_for(spool, control_plane.url)
    reporter.start()
    await until(lambda: spool.pending == 0)
    await reporter.stop()

    await control_plane.stop()  # the control plane goes down; the broker meters on, then dies
    reporter = reporter_for(spool, control_plane.url)
    reporter.start()
    unacked = spool_minutes(spool, "broker-a", range(2, 5))
    reporter.wake()
    await until(lambda: reporter.failures >= 2)
    await reporter.stop()
    spool.close()

    await control_plane.start()
    restarted = UsageSpool(str(tmp_path))  # a new broker process on the same spool directory
    assert restarted.pending == len(unacked)
    reporter = reporter_for(restarted, control_plane.url)
    reporter.start()
    await until(lambda: restarted.pending == 0)
    await reporter.stop()
    assert control_plane.accepted_ids() == delivered_before + unacked
    assert len(set(control_plane.accepted_ids())) == len(control_plane.accepted) == 10


@pytest.mark.asyncio
async def test_backoff_doubles_up_to_its_cap(tmp_path: Path, control_plane: ControlPlane) -> None:
    await control_plane.stop()
    spool = UsageSpool(str(tmp_path))
    spool_minutes(spool, "b", range(1))
    delays: list[float] = []
    done = asyncio.Event()

    async def sleep(s: float) -> None:
        delays.append(s)
        if len(delays) >= 7:
            done.set()
        await asyncio.sleep(0)

    reporter = reporter_for(spool, control_plane.url, backoff_initial_s=1.0, backoff_max_s=16.0, sleep=sleep)
    reporter.start()
    await asyncio.wait_for(done.wait(), 10)
    await reporter.stop()
    assert delays[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 16.0]
    assert spool.pending == 2

    for rng_value, expected in ((1.0, 4.8), (0.0, 3.2)):  # 4 s with 20 % jitter either way
        jittered = reporter_for(
            spool,
            control_plane.url,
            backoff_initial_s=1.0,
            backoff_max_s=60.0,
            backoff_jitter=0.2,
            rng=lambda v=rng_value: v,
        )
        assert jittered.backoff_delay_s(3) == pytest.approx(expected)


@pytest.mark.asyncio
async def test_disk_work_runs_off_the_event_loop_thread(tmp_path: Path, control_plane: ControlPlane) -> None:
    spool = UsageSpool(str(tmp_path))
    spool_minutes(spool, "b", range(2))
    loop_thread = threading.get_ident()
    threads: list[tuple[str, int]] = []

    def watch(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def wrapped(*args: object) -> object:
            threads.append((name, threading.get_ident()))
            return fn(*args)

        return wrapped

    spool.read_batch = watch("read", spool.read_batch)  # type: ignore[method-assign,assignment]
    spool.ack = watch("ack", spool.ack)  # type: ignore[method-assign,assignment]
    reporter = reporter_for(spool, control_plane.url)
    reporter.start()
    await until(lambda: spool.pending == 0)
    await reporter.stop()
    assert {name for name, _ in threads} == {"read", "ack"}
    assert all(ident != loop_thread for _, ident in threads)


@pytest.mark.asyncio
async def test_meter_run_wakes_the_reporter(tmp_path: Path, control_plane: ControlPlane) -> None:
    now = [T0 + 59_000]
    spool = UsageSpool(str(tmp_path))
    meter = UsageMeter("b", spool=spool, clock_ms=lambda: now[0])
    reporter = reporter_for(spool, control_plane.url, idle_interval_s=3600)  # only a wake sends
    reporter.start()
    await asyncio.sleep(0.05)  # the reporter found nothing and idles

    rolled = asyncio.Event()

    async def sleep(s: float) -> None:
        if rolled.is_set():
            await asyncio.Event().wait()  # the second wait: park until cancelled
        now[0] += int(s * 1000)
        meter.record_request("acme", 1, 0)
        rolled.set()

    def on_spooled(n: int) -> None:
        reporter.wake()

    run: asyncio.Task[None] = asyncio.create_task(meter.run(sleep=sleep, on_spooled=on_spooled))
    await until(lambda: len(control_plane.accepted) == 1)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await reporter.stop()
    assert control_plane.accepted_ids() == [f"b:{T0}:acme"]
