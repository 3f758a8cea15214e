"""UsageReporter: sends the spool's records to the control plane, oldest first.

    loop: batch = spool.read_batch(batch_records)             (worker thread)
          POST {control_plane_url}/internal/v1/usage          {"records": [...]}
               Authorization: Bearer <token()>
          2xx   → spool.ack(batch)                            (worker thread; fsync) → next batch at once
          other → wait backoff (initial * 2^k, capped, ± jitter) and send the same batch again
          none left → wait ``idle_interval_s`` or ``wake()``

At-least-once from the broker, exactly-once in effect: a batch is acknowledged in the spool only
after a 2xx, so records survive a control plane that is down and a broker that restarts; the
only resend of a delivered record is after a lost 2xx, and the control plane drops it by its
``report_id``. Any non-2xx answer (a 401 with a stale token included: ``token`` is called again
for every attempt) is retried with backoff; the reporter never skips a record.

Disk work (reading, the ack's fsync) runs in ``asyncio.to_thread``: the event loop never waits on
the disk.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable

import aiohttp
import orjson

from data_plane.tenancy.usage_spool import SpoolBatch, UsageSpool
from data_plane.tls import http_ssl

log = logging.getLogger(__name__)

USAGE_PATH = "/internal/v1/usage"

TokenSource = Callable[[], str | Awaitable[str]]


class ReportError(Exception):
    """One send failed (transport error or a non-2xx answer)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UsageReporter:
    def __init__(
        self,
        spool: UsageSpool,
        *,
        control_plane_url: str,
        token: TokenSource,
        batch_records: int = 500,
        idle_interval_s: float = 5.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        backoff_jitter: float = 0.2,
        request_timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if batch_records < 1:
            raise ValueError("batch_records must be >= 1")
        self.spool = spool
        self.url = control_plane_url.rstrip("/") + USAGE_PATH
        self._token = token
        self.batch_records = batch_records
        self.idle_interval_s = idle_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.backoff_jitter = backoff_jitter
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session = session
        self._own_session = session is None
        self._sleep = sleep
        self._rng = rng
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # figures for logs and tests
        self.batches_sent = 0
        self.records_acked = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error: str = ""

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="usage-reporter")
        return self._task

    async def stop(self) -> None:
        """Stop sending (a batch in flight is abandoned, not acknowledged) and close the session."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():  # we were cancelled ourselves
                    raise
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def wake(self) -> None:
        """New records were spooled: send them now rather than after the idle wait."""
        self._wake.set()

    # --- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                sent = await self.report_once()
            except ReportError as e:
                self.failures += 1
                self.consecutive_failures += 1
                self.last_error = str(e)
                delay = self.backoff_delay_s(self.consecutive_failures)
                log.warning(
                    "usage report to %s failed (%s; %d records waiting): retrying in %.1f s",
                    self.url,
                    e,
                    self.spool.pending,
                    delay,
                )
                await self._sleep(delay)
                continue
            self.consecutive_failures = 0
            if not sent:
                await self._idle(self.idle_interval_s)

    def backoff_delay_s(self, failures: int) -> float:
        """Wait after the ``failures``-th failure in a row: initial * 2^(failures-1), capped, ± jitter."""
        base = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(failures - 1, 62))
        if self.backoff_jitter:
            base *= 1.0 + self.backoff_jitter * (2.0 * self._rng() - 1.0)
        return max(0.0, base)

    async def report_once(self) -> int:
        """Send one batch; how many records the control plane acknowledged (0: nothing waiting).
        Raises ReportError when the send failed (the records stay in the spool)."""
        batch = await asyncio.to_thread(self.spool.read_batch, self.batch_records)
        if batch is None:
            return 0
        await self._post(batch)
        await asyncio.to_thread(self.spool.ack, batch)
        self.batches_sent += 1
        self.records_acked += len(batch.records)
        return len(batch.records)

    async def _post(self, batch: SpoolBatch) -> None:
        try:
            token = self._token()
            if inspect.isawaitable(token):
                token = await token
        except Exception as e:
            raise ReportError(f"no token: {e!r}") from e
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=http_ssl()))
        body = orjson.dumps({"records": batch.records})
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            async with self._session.post(self.url, data=body, headers=headers, timeout=self._timeout) as resp:
                text = await resp.text()
                if not 200 <= resp.status < 300:
                    raise ReportError(f"HTTP {resp.status}: {text[:200]}", status=resp.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ReportError(f"{type(e).__name__}: {e}") from e

    async def _idle(self, timeout_s: float) -> None:
        if not self._wake.is_set():
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=timeout_s)
            finally:
                waiter.cancel()
        self._wake.clear()
