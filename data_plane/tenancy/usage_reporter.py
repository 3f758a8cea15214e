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
import logging
import random
from collections.abc import Awaitable, Callable

import aiohttp

from data_plane.tenancy.report_poster import ReportError, ReportPoster, TokenSource
from data_plane.tenancy.usage_spool import UsageSpool

log = logging.getLogger(__name__)

USAGE_PATH = "/internal/v1/usage"


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
        self.poster = ReportPoster(
            control_plane_url, USAGE_PATH, token, request_timeout_s=request_timeout_s, session=session
        )
        self.url = self.poster.url
        self.batch_records = batch_records
        self.idle_interval_s = idle_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.backoff_jitter = backoff_jitter
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
        await self.poster.close()

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
        await self.poster.post({"records": batch.records})
        await asyncio.to_thread(self.spool.ack, batch)
        self.batches_sent += 1
        self.records_acked += len(batch.records)
        return len(batch.records)

    async def _idle(self, timeout_s: float) -> None:
        if not self._wake.is_set():
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=timeout_s)
            finally:
                waiter.cancel()
        self._wake.clear()
