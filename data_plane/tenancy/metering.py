"""UsageMeter: what each tenant used on this broker, minute by minute.

Counters per tenant, bumped on the hot path by ``record_request`` (one dict lookup and four
additions; a pull's also counts the messages it delivered):

    requests_4k   a request moving n bytes (in + out) counts ceil(n / 4096) units, at least 1
    bytes_in      bytes received (a send's messages)
    bytes_out     bytes returned (a pull's messages)
    messages_in   messages the tenant published that the broker stored (``record_stored``)
    messages_out  messages delivered to the tenant's consumers (pulls and POP receives:
                  ``record_request``'s ``messages_out``)
    throttled_requests  requests refused because the tenant was over a quota or limit
                  (``record_throttled``: one dict lookup and one addition)
    stored_bytes  a gauge the broker sets periodically (``set_stored_bytes``), not a sum: the
                  tenant's bytes on this broker's disk
    tiered_bytes  a gauge set with it (``replace_stored_bytes``): the tenant's bytes this broker
                  keeps in object storage only
    forced_deleted_messages  messages the store deleted inside their retention at the disk's
                  emergency watermark (``record_forced_deletion``)

A record always carries requests_4k, bytes_in, bytes_out and stored_bytes; the others only when
not 0, so records of brokers that count none of them keep the shape control planes without them
accept.

The caller drives time: ``roll(now_ms)`` with a wall clock. The counters gathered since the last
roll belong to the open minute; when ``now_ms`` is in a later minute they become one
``UsageRecord`` per tenant (a tenant with traffic or stored bytes), and the minute ``now_ms`` is
in opens. (``period_ms``, one minute by default, may be any divisor of a minute: tests, and
brokers that want usage sooner, roll every few seconds; each period is its own record, keyed by
its start, and the control plane adds a minute's periods up.) A late roll therefore shifts a few
seconds of traffic into the earlier minute: totals are never lost nor counted twice, only their
minute may be off by the lateness. A wall clock stepping back never re-emits a minute: minutes
are strictly increasing per broker, also across restarts (the spool remembers the last one), so
``report_id = f"{broker}:{minute}:{tenant}"`` is unique and a resend of the same record is
idempotent on the control plane.

``roll_and_spool`` writes the records to the UsageSpool on a worker thread, then hands them to
``publish`` when given (the broker's UsageTopic: ORBIT_SYS_USAGE, for the Spark pipeline). When the
spool is full (or the disk fails) the records' counters are folded back into the open minute and reported with
a later minute once there is room: delayed, not lost — except by a crash meanwhile, which loses
what is only in memory, as it loses the open minute's counters. Stored-bytes samples of the
minutes folded that way are not kept (a gauge keeps only its last value).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import NotRequired, TypedDict

from data_plane.tenancy.usage_spool import SpoolStatus, UsageSpool

log = logging.getLogger(__name__)

REQUEST_UNIT_BYTES = 4096
MINUTE_MS = 60_000


class UsageRecord(TypedDict):
    """One tenant's usage on one broker for one minute: the wire JSON of the usage report."""

    report_id: str
    broker: str
    tenant: str
    minute: int  # epoch ms of the minute's start
    requests_4k: int
    bytes_in: int
    bytes_out: int
    stored_bytes: int
    forced_deleted_messages: NotRequired[int]  # present when not 0
    tiered_bytes: NotRequired[int]  # present when not 0 (brokers without a tier never send it)
    messages_in: NotRequired[int]  # present when not 0
    messages_out: NotRequired[int]  # present when not 0
    throttled_requests: NotRequired[int]  # present when not 0


def request_units(nbytes: int) -> int:
    """Billing units of one request moving ``nbytes``: ceil(nbytes / 4096), at least 1."""
    return ((nbytes + REQUEST_UNIT_BYTES - 1) // REQUEST_UNIT_BYTES) or 1


def report_id(broker: str, minute: int, tenant: str) -> str:
    return f"{broker}:{minute}:{tenant}"


def minute_of(ms: int) -> int:
    return ms - ms % MINUTE_MS


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class _Counters:
    __slots__ = (
        "bytes_in",
        "bytes_out",
        "forced_deleted_messages",
        "messages_in",
        "messages_out",
        "requests_4k",
        "throttled_requests",
    )

    def __init__(self) -> None:
        self.requests_4k = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.forced_deleted_messages = 0
        self.messages_in = 0
        self.messages_out = 0
        self.throttled_requests = 0


# The counters a record carries only when not 0 (``UsageRecord``'s NotRequired counters).
_SPARSE_COUNTERS = ("forced_deleted_messages", "messages_in", "messages_out", "throttled_requests")


class UsageMeter:
    __slots__ = (
        "_clock",
        "_counters",
        "_last_minute",
        "_open_minute",
        "_period",
        "_publish",
        "_roll_lock",
        "_spool",
        "_stored",
        "_tiered",
        "broker",
    )

    def __init__(
        self,
        broker: str,
        *,
        spool: UsageSpool | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        period_ms: int = MINUTE_MS,
        publish: Callable[[list[UsageRecord]], object] | None = None,
    ) -> None:
        if period_ms <= 0 or MINUTE_MS % period_ms:
            raise ValueError(f"period_ms must divide a minute ({MINUTE_MS} ms), not {period_ms}")
        self.broker = broker
        self._period = period_ms
        self._spool = spool
        self._publish = publish  # also told every spooled roll's records (the usage topic)
        self._clock = clock_ms
        self._counters: dict[str, _Counters] = {}
        self._stored: dict[str, int] = {}
        self._tiered: dict[str, int] = {}
        self._open_minute = self._floor(clock_ms())
        self._last_minute = spool.last_minute if spool is not None else 0  # the latest minute emitted
        self._roll_lock = asyncio.Lock()

    # --- the hot path -------------------------------------------------------------------------
    def record_request(self, tenant: str, nbytes_in: int, nbytes_out: int, messages_out: int = 0) -> None:
        """A request of ``tenant`` moving these bytes; ``messages_out``: the messages it delivered."""
        c = self._counters.get(tenant)
        if c is None:
            c = self._counters[tenant] = _Counters()
        c.requests_4k += ((nbytes_in + nbytes_out + 4095) >> 12) or 1
        c.bytes_in += nbytes_in
        c.bytes_out += nbytes_out
        c.messages_out += messages_out

    def record_stored(self, tenant: str, messages: int) -> None:
        """``messages`` the tenant published were stored (the request itself is metered apart)."""
        c = self._counters.get(tenant)
        if c is None:
            c = self._counters[tenant] = _Counters()
        c.messages_in += messages

    def record_throttled(self, tenant: str) -> None:
        """One request of ``tenant`` refused for a quota or limit (also on the frame path: keep it
        this cheap)."""
        c = self._counters.get(tenant)
        if c is None:
            c = self._counters[tenant] = _Counters()
        c.throttled_requests += 1

    # --- messages lost to the disk's emergency watermark -------------------------------------------
    def record_forced_deletion(self, tenant: str, messages: int) -> None:
        c = self._counters.get(tenant)
        if c is None:
            c = self._counters[tenant] = _Counters()
        c.forced_deleted_messages += messages

    # --- the storage gauge ----------------------------------------------------------------------
    def set_stored_bytes(self, tenant: str, nbytes: int) -> None:
        if nbytes > 0:
            self._stored[tenant] = nbytes
        else:
            self._stored.pop(tenant, None)

    def replace_stored_bytes(self, stored: Mapping[str, int], tiered: Mapping[str, int] | None = None) -> None:
        """Both gauges at once: tenants missing from ``stored`` store nothing on the disk, those
        missing from ``tiered`` (all, when None) nothing in object storage only."""
        self._stored = {t: n for t, n in stored.items() if n > 0}
        self._tiered = {t: n for t, n in (tiered or {}).items() if n > 0}

    # --- minutes --------------------------------------------------------------------------------
    def _floor(self, ms: int) -> int:
        return ms - ms % self._period

    @property
    def period_ms(self) -> int:
        return self._period

    @property
    def open_minute(self) -> int:
        return self._open_minute

    def roll(self, now_ms: int) -> list[UsageRecord]:
        """Close the open minute when ``now_ms`` is past it: its records (counters reset);
        [] while ``now_ms`` is still in it (or behind it: a wall clock stepping back)."""
        minute = self._floor(now_ms)
        if minute <= self._open_minute:
            return []
        closed = self._open_minute
        self._open_minute = minute
        if closed <= self._last_minute:  # never two reports of one minute (clock stepped back)
            closed = self._last_minute + self._period
        counters, self._counters = self._counters, {}
        records: list[UsageRecord] = []
        for tenant in sorted(counters.keys() | self._stored.keys() | self._tiered.keys()):
            c = counters.get(tenant)
            record: UsageRecord = {
                "report_id": report_id(self.broker, closed, tenant),
                "broker": self.broker,
                "tenant": tenant,
                "minute": closed,
                "requests_4k": c.requests_4k if c else 0,
                "bytes_in": c.bytes_in if c else 0,
                "bytes_out": c.bytes_out if c else 0,
                "stored_bytes": self._stored.get(tenant, 0),
            }
            if c is not None:
                for f in _SPARSE_COUNTERS:
                    if n := getattr(c, f):
                        record[f] = n  # type: ignore[literal-required]
            if tenant in self._tiered:
                record["tiered_bytes"] = self._tiered[tenant]
            records.append(record)
        if records:
            self._last_minute = closed
        return records

    def fold_back(self, records: Iterable[UsageRecord]) -> None:
        """Records that could not be spooled: their counters go back into the open minute."""
        for r in records:
            c = self._counters.get(r["tenant"])
            if c is None:
                c = self._counters[r["tenant"]] = _Counters()
            c.requests_4k += r["requests_4k"]
            c.bytes_in += r["bytes_in"]
            c.bytes_out += r["bytes_out"]
            for f in _SPARSE_COUNTERS:
                setattr(c, f, getattr(c, f) + r.get(f, 0))

    async def roll_and_spool(self, now_ms: int | None = None) -> int:
        """``roll`` and append the records to the spool (fsync on a worker thread). How many
        records were spooled; 0 also when the spool refused them (they are folded back)."""
        if self._spool is None:
            raise RuntimeError("this meter has no spool")
        async with self._roll_lock:
            records = self.roll(self._clock() if now_ms is None else now_ms)
            if not records:
                return 0
            try:
                status = await asyncio.to_thread(self._spool.append, records)
            except OSError:
                log.exception("usage spool append failed: %d records kept in memory for the next minute", len(records))
                status = SpoolStatus.FULL
            if status is SpoolStatus.FULL:
                log.warning(
                    "usage of %d tenants for minute %d not spooled: folded into minute %d, reported once the "
                    "spool has room (the control plane must acknowledge records for that)",
                    len(records),
                    records[0]["minute"],
                    self._open_minute,
                )
                self.fold_back(records)
                return 0
            if self._publish is not None:
                try:
                    self._publish(records)
                except Exception:
                    log.exception("publishing %d usage records failed (the spool has them)", len(records))
            return len(records)

    async def run(
        self,
        *,
        lag_ms: int = 1000,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_spooled: Callable[[int], None] | None = None,
    ) -> None:
        """Roll and spool ``lag_ms`` (at most half a period) after every period boundary, forever
        (cancel to stop). ``on_spooled(n)`` is told how many records went to the spool (e.g. a
        reporter's wake)."""
        lag_ms = min(lag_ms, self._period // 2)
        while True:
            now = self._clock()
            next_roll = self._floor(now) + self._period + lag_ms
            await sleep(max(0.0, (next_roll - now) / 1000.0))
            try:
                n = await self.roll_and_spool()
            except Exception:
                log.exception("usage roll failed")
                continue
            if n and on_spooled is not None:
                on_spooled(n)
