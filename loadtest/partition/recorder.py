"""Recorder: producers sending numbered messages at a steady, modest rate through the group's
client proxies, recording every acknowledgement and every refusal.

Each SEND_OK is an ``Ack``: the message's ids and body, the member that answered (the message
id's store port is that member's published client port), and when the send started and was
answered (monotonic, for gaps; wall clock, for comparing with the control plane's elections).
Anything else (a non-OK status, a timeout, a refused connection) is a ``Refusal`` with its time.

The senders are paced (``rate_per_s`` over ``senders`` lanes, each sending its next message at
its next slot, never catching up in a burst), with ``retry_times=0`` and a short send timeout, so
that a gap between acknowledgements is the group's, not the client's retries. The SDK refreshes
its routes every 500 ms.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from data_plane.store.message import decode_message_id
from sdk import Message, Producer, SendStatus
from sdk.errors import OrbitError

log = logging.getLogger(__name__)

TOPIC = "PartitionLoad"
QUEUES = 4


@dataclass(frozen=True, slots=True)
class Ack:
    n: int  # the message's number (also at the head of its body)
    msg_id: str  # UNIQ_KEY
    offset_msg_id: str  # store host:port + CommitLog offset
    body: bytes
    member: int | None  # who answered
    start: float  # monotonic, when the send began
    at: float  # monotonic, when SEND_OK arrived
    start_wall: float
    at_wall: float


@dataclass(frozen=True, slots=True)
class Refusal:
    n: int
    what: str  # a status (FLUSH_SLAVE_TIMEOUT, ...) or an error's class and text
    member: int | None  # who answered, where known
    start: float
    at: float
    at_wall: float


@dataclass
class RecorderOptions:
    rate_per_s: float = 40.0
    senders: int = 4
    body_bytes: int = 128
    send_timeout_ms: int = 3000
    route_refresh_interval_ms: int = 500
    seed: int = 0


@dataclass
class Recorder:
    namesrv: str
    member_of_store_port: Callable[[int], int | None]
    member_of_addr: Callable[[str], int | None]
    options: RecorderOptions = field(default_factory=RecorderOptions)
    acks: list[Ack] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    _ack_times: list[float] = field(default_factory=list)  # acks' ``at``, ascending
    _n: int = 0
    _in_flight: int = 0
    _running: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _stop: bool = False
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _producer: Producer | None = None
    _rng: random.Random = field(default_factory=random.Random)

    async def start(self) -> None:
        o = self.options
        self._rng = random.Random(o.seed)
        self._producer = Producer(
            "partition-recorder", namesrv_addrs=self.namesrv, instance_name=f"partition-{id(self)}",
            send_timeout_ms=o.send_timeout_ms, retry_times=0, route_refresh_interval_ms=o.route_refresh_interval_ms,
        )  # fmt: skip
        await self._producer.start()
        await self._producer.create_topic(TOPIC, queue_nums=QUEUES)
        self._running.set()
        self._idle.set()
        interval = o.senders / o.rate_per_s
        began = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._lane(began + i * interval / o.senders, interval), name=f"recorder-{i}")
            for i in range(o.senders)
        ]

    async def _lane(self, first: float, interval: float) -> None:
        assert self._producer is not None
        next_at = first
        while not self._stop:
            await self._running.wait()
            now = time.monotonic()
            if next_at > now:
                await asyncio.sleep(next_at - now)
            next_at = max(next_at + interval, time.monotonic())
            if self._stop or not self._running.is_set():
                continue
            await self._send_one()

    async def _send_one(self) -> None:
        assert self._producer is not None
        n = self._n
        self._n += 1
        body = f"{n:09d}:".encode() + self._rng.randbytes(self.options.body_bytes)
        self._in_flight += 1
        self._idle.clear()
        start, start_wall = time.monotonic(), time.time()
        try:
            r = await self._producer.send(Message(TOPIC, body))
        except OrbitError as e:
            self.refusals.append(Refusal(n, f"{type(e).__name__}: {str(e)[:160]}", self.member_of_addr(e.addr),
                                         start, time.monotonic(), time.time()))  # fmt: skip
        except Exception as e:  # a bug in the client: recorded, the load goes on
            log.exception("send failed")
            self.refusals.append(Refusal(n, f"{type(e).__name__}: {str(e)[:160]}", None, start, time.monotonic(),
                                         time.time()))  # fmt: skip
        else:
            at, at_wall = time.monotonic(), time.time()
            member = self._member_of_id(r.offset_msg_id)
            if r.status is SendStatus.SEND_OK:
                self.acks.append(Ack(n, r.msg_id, r.offset_msg_id, body, member, start, at, start_wall, at_wall))
                self._ack_times.append(at)  # answers arrive in time order: ascending
            else:
                self.refusals.append(Refusal(n, r.status.value, member, start, at, at_wall))
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _member_of_id(self, offset_msg_id: str) -> int | None:
        with contextlib.suppress(ValueError):
            return self.member_of_store_port(decode_message_id(offset_msg_id)[1])
        return None

    async def pause(self) -> None:
        """No new sends; returns once every send in flight has its answer."""
        self._running.clear()
        await self._idle.wait()

    def resume(self) -> None:
        self._running.set()

    async def stop(self) -> None:
        self._stop = True
        self._running.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        if self._producer is not None:
            await self._producer.shutdown()

    # --- reading what was recorded ------------------------------------------------------------------
    def ack_times_between(self, t0: float, t1: float) -> list[float]:
        """Monotonic times of the SEND_OKs in [t0, t1]."""
        i = bisect.bisect_left(self._ack_times, t0)
        j = bisect.bisect_right(self._ack_times, t1)
        return self._ack_times[i:j]

    def first_ack_after(self, t: float) -> float | None:
        i = bisect.bisect_right(self._ack_times, t)
        return self._ack_times[i] if i < len(self._ack_times) else None

    def refusals_between(self, t0: float, t1: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.refusals:
            if t0 <= r.at <= t1:
                key = r.what.split(":")[0]
                out[key] = out.get(key, 0) + 1
        return out
