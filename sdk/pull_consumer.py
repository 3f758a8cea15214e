"""PullConsumer: the application asks for messages (RocketMQ's DefaultLitePullConsumer).

::

    consumer = PullConsumer("reports", namesrv_addrs="127.0.0.1:9876")
    consumer.subscribe("orders", "paid")           # the group shares the queues (rebalance), or
    consumer.assign(await consumer.fetch_queues("orders"))   # ... this member takes the ones it names
    await consumer.start()
    while running:
        for msg in await consumer.poll(timeout_ms=1000):
            handle(msg)
        await consumer.commit()                     # the group's offsets move only here
    await consumer.shutdown()

Background pull loops (one per queue, long polling, flow control — ``sdk.consumer``) fill a
buffer; ``poll`` hands out one pulled batch of one queue, in queue order, and moves that queue's
consumed position past it. ``commit`` stores the consumed positions as the group's offsets
(UPDATE_CONSUMER_OFFSET, waiting for the answer): messages polled but not committed come back
after a restart or a rebalance (at least once). ``enable_auto_commit`` commits every
``auto_commit_interval_ms`` too. ``seek`` moves a queue's position (what was buffered for it is
discarded).

With ``telemetry=`` on, a poll that returns messages makes a ``receive <topic>`` span covering its
wait, under the caller's current span and linked to each message's producer span.

``subscribe`` and ``assign`` exclude each other. With ``assign`` the rebalance only follows the
assigned set (``assign`` may be called again while running).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Unpack

from sdk.consumer import ConsumerBase, ConsumerOptions
from sdk.errors import ClientStateError, IllegalArgumentError, OrbitError
from sdk.message import MessageExt, MessageQueue
from sdk.process_queue import ProcessQueue
from sdk.subscription import MessageSelector, parse_subscription

log = logging.getLogger(__name__)

_ASSIGN = "ASSIGN"
_SUBSCRIBE = "SUBSCRIBE"


class PullConsumer(ConsumerBase):
    consume_type = "CONSUME_ACTIVELY"

    def __init__(
        self,
        group: str,
        *,
        enable_auto_commit: bool = False,
        auto_commit_interval_ms: int = 5000,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(group, **options)
        if auto_commit_interval_ms <= 0:
            raise IllegalArgumentError("auto_commit_interval_ms must be > 0")
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._mode: str | None = None
        self._assigned: set[MessageQueue] = set()
        self._ready: asyncio.Queue[tuple[MessageQueue, ProcessQueue, list[MessageExt]]] = asyncio.Queue()
        self._positions: dict[MessageQueue, int] = {}
        self._pending_seeks: dict[MessageQueue, int] = {}

    # --- what to consume --------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | MessageSelector = "*", *, sql: str | None = None) -> None:
        if self._mode == _ASSIGN:
            raise ClientStateError("subscribe() and assign() exclude each other")
        super().subscribe(topic, expression, sql=sql)
        self._mode = _SUBSCRIBE

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume exactly these queues (no group rebalance). May be called again while running."""
        if self._mode == _SUBSCRIBE:
            raise ClientStateError("subscribe() and assign() exclude each other")
        queues = set(queues)
        for mq in queues:
            if not isinstance(mq, MessageQueue):
                raise IllegalArgumentError(f"assign() takes MessageQueues, got {type(mq).__name__}")
            if mq.topic not in self.subscriptions:
                self.subscriptions[mq.topic] = parse_subscription(mq.topic, "*")
        self._mode = _ASSIGN
        self._assigned = queues
        if self._started:
            self.request_rebalance()

    def _check_ready(self) -> None:
        if self._mode is None:
            raise ClientStateError("subscribe() or assign() before start()")

    def _topics_to_balance(self) -> Iterable[str]:
        if self._mode == _ASSIGN:
            return sorted({mq.topic for mq in self._assigned} | {mq.topic for mq in self._pqs})
        return super()._topics_to_balance()

    async def _wanted_queues(self, topic: str) -> set[MessageQueue] | None:
        if self._mode == _ASSIGN:
            return {mq for mq in self._assigned if mq.topic == topic}
        return await super()._wanted_queues(topic)

    def _extra_tasks(self) -> list[asyncio.Task[None]]:
        if self.enable_auto_commit:
            return [asyncio.create_task(self._auto_commit_loop(), name=f"orbit-autocommit-{self.group}")]
        return []

    async def _auto_commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_ms / 1000)
            try:
                await self.commit()
            except OrbitError as e:
                log.warning("consumer %s: auto commit failed: %s", self.group, e)

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (fresh from the name server)."""
        return list((await self.instance.route(topic, refresh=True)).subscribe_queues)

    # --- queues coming and going -----------------------------------------------------------------------------
    async def _queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        self._positions.pop(mq, None)

    def _start_pulling(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        offset = self._pending_seeks.pop(mq, offset)  # a seek made while the queue was being added wins
        self._positions[mq] = offset
        super()._start_pulling(mq, pq, offset)

    async def _on_messages(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self._ready.put_nowait((mq, pq, msgs))

    def _correct_offset(self, mq: MessageQueue, pq: ProcessQueue, next_offset: int) -> None:
        if pq.count == 0 and self._pqs.get(mq) is pq:
            self._positions[mq] = max(self._positions.get(mq, 0), next_offset)

    # --- the application's side --------------------------------------------------------------------------------
    async def poll(self, timeout_ms: int = 5000) -> list[MessageExt]:
        """The next pulled batch (one queue's, in order), or [] after ``timeout_ms``."""
        if not self._started or self._closed:
            raise ClientStateError("consumer is not running")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        started_ns = 0 if self.telemetry is None else time.time_ns()
        while True:
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    mq, pq, msgs = self._ready.get_nowait()
                else:
                    async with asyncio.timeout(remaining):
                        mq, pq, msgs = await self._ready.get()
            except (TimeoutError, asyncio.QueueEmpty):
                return []
            if pq.is_dropped() or self._pqs.get(mq) is not pq:
                continue  # buffered before a seek or a rebalance took the queue away
            offset = pq.remove(msgs)
            if offset >= 0:
                self._positions[mq] = offset
            if started_ns:
                self._receive_span(msgs, started_ns)
            return msgs

    def _receive_span(self, msgs: list[MessageExt], started_ns: int) -> None:
        from sdk import telemetry as t

        assert self.telemetry is not None
        model = self.message_model.value
        with t.consumer_span(
            self.telemetry, msgs, self.group, operation="receive", consumption_model=model, start_time=started_ns
        ):
            pass

    def position(self, mq: MessageQueue) -> int | None:
        """The offset of the next message ``poll`` will return for ``mq`` (None if not assigned)."""
        return self._positions.get(mq)

    async def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> dict[MessageQueue, int]:
        """Store the consumed positions (or the given offsets) as the group's offsets and wait
        for the brokers to take them; returns what was committed."""
        store = self.offset_store
        positions = {mq: p for mq, p in self._positions.items() if mq in self._pqs}
        chosen = positions if offsets is None else dict(offsets)
        for mq, off in chosen.items():
            if off < 0:
                raise IllegalArgumentError(f"offset {off} of {mq} is negative")
            store.update(mq, off, increase_only=False)
        if chosen:
            await store.persist(list(chosen), sync=True)
        return chosen

    async def committed(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq`` as its broker has it (None: none yet)."""
        return await self.offset_store.read_store(mq)

    def _check_seek(self, mq: MessageQueue, offset: int) -> None:
        if not self._started or self._closed:
            raise ClientStateError("seek needs a running consumer")
        if offset < 0:
            raise IllegalArgumentError(f"offset {offset} is negative")
        if mq not in self._pqs and mq not in self._assigned:
            raise IllegalArgumentError(f"{mq} is not assigned to this consumer")

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue ``mq`` from ``offset``: buffered messages of the queue are discarded and the
        next ``poll`` of it starts there. An offset outside the queue is corrected by the broker."""
        self._check_seek(mq, offset)
        old = self._pqs.get(mq)
        if old is None:
            self._pending_seeks[mq] = offset
            return
        old.drop()
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
        pq = ProcessQueue()
        pq.limits = old.limits
        self._pqs[mq] = pq
        self._start_pulling(mq, pq, offset)

    async def seek_to_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """Seek to the first message stored at or after ``timestamp_ms``; returns the offset."""
        self._check_seek(mq, 0)
        offset = await self.search_offset(mq, timestamp_ms)
        self.seek(mq, offset)
        return offset

    async def seek_to_begin(self, mq: MessageQueue) -> int:
        self._check_seek(mq, 0)
        offset = await self.min_offset(mq)
        self.seek(mq, offset)
        return offset

    async def seek_to_end(self, mq: MessageQueue) -> int:
        self._check_seek(mq, 0)
        offset = await self.max_offset(mq)
        self.seek(mq, offset)
        return offset

    async def shutdown(self) -> None:
        with contextlib.suppress(ClientStateError):
            if self.enable_auto_commit and self._started and not self._closed:
                with contextlib.suppress(OrbitError):
                    await self.commit()
        await super().shutdown()
