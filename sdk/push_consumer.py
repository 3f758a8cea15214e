"""PushConsumer: pulls in the background and calls the application's listener (RocketMQ's
DefaultMQPushConsumer).

::

    consumer = PushConsumer("orders-consumer", namesrv_addrs="127.0.0.1:9876")
    consumer.subscribe("orders", "paid || refunded")

    @consumer.on_message
    async def handle(msgs: list[MessageExt]) -> ConsumeResult:
        ...
        return ConsumeResult.SUCCESS

    await consumer.start()
    ...
    await consumer.shutdown()

Two kinds of listener:

* ``on_message`` — concurrent: up to ``consume_concurrency`` listener calls at once, each with up
  to ``consume_batch_size`` messages of one queue, in any order. SUCCESS commits them (the queue's
  committed offset is the lowest offset not yet consumed). RECONSUME_LATER or an exception, in
  CLUSTERING mode, sends each message back to the broker (CONSUMER_SEND_MSG_BACK, ``sdk.retry``):
  it comes again from the group's retry topic ``%RETRY%<group>`` after the retry ladder's delay
  (10s 30s 1m … 2h), with the original topic and the broker's ``reconsume_times``, and after
  ``max_reconsume_times`` (-1: 16) it goes to the dead-letter queue ``%DLQ%<group>``. When the
  send-back fails, and in BROADCASTING mode, the batch is redelivered to this consumer after
  ``reconsume_delay_ms`` (broadcasting: up to ``max_reconsume_times`` times, then logged and
  skipped).
* ``on_message_orderly`` — orderly: one call at a time per queue, in queue order. In CLUSTERING
  mode the member holds the broker's lock on each of its queues (LOCK_BATCH_MQ, renewed every
  ``lock_interval_ms``; the broker lets a lock lapse after 60 s) and only consumes a queue it
  holds, so during a rebalance the new owner starts after the old one committed and let go.
  SUSPEND_CURRENT_QUEUE_A_MOMENT (or RECONSUME_LATER, or an exception) retries the same messages
  in place after ``suspend_current_queue_ms`` (3 s), nothing after them is consumed meanwhile;
  with ``max_reconsume_times`` >= 0 (-1: unlimited) a message retried that often goes to the
  dead-letter queue (CLUSTERING) and the queue moves on.

The listener may be a coroutine function or a plain function.

With ``telemetry=`` on, each listener call runs inside a ``process <topic>`` span, the child of
the producer's span carried by the message (a batch's span links to each producer's span).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Unpack

from sdk import protocol
from sdk.aio import wait_event
from sdk.consumer import QUICK_REBALANCE_MS, ConsumerBase, ConsumerOptions
from sdk.errors import ClientStateError, IllegalArgumentError, OrbitError, RouteNotFoundError
from sdk.message import MessageExt, MessageQueue
from sdk.process_queue import ProcessQueue, monotonic_ms
from sdk.retry import DEFAULT_MAX_RECONSUME_TIMES, DELAY_LEVEL_DLQ, restore_retry_topics, retry_topic, send_back_request
from sdk.subscription import parse_subscription

log = logging.getLogger(__name__)

_SENT_TO_DLQ = "orbit.sent_to_dlq"  # MessageExt.extra key: an orderly message parked in the DLQ


class ConsumeResult(enum.Enum):
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"  # concurrent: redeliver later
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"  # orderly: retry in place


Listener = Callable[[list[MessageExt]], "Awaitable[ConsumeResult] | ConsumeResult"]


class PushConsumer(ConsumerBase):
    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        group: str,
        *,
        consume_batch_size: int = 1,
        consume_concurrency: int = 20,
        max_reconsume_times: int = -1,
        reconsume_delay_ms: int = 1000,
        suspend_current_queue_ms: int = 3000,
        lock_interval_ms: int = 20000,
        await_termination_ms: int = 30000,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(group, **options)
        if consume_batch_size < 1 or consume_concurrency < 1:
            raise IllegalArgumentError("consume_batch_size and consume_concurrency must be >= 1")
        self.consume_batch_size = consume_batch_size
        self.consume_concurrency = consume_concurrency
        self.max_reconsume_times = max_reconsume_times
        self.reconsume_delay_ms = reconsume_delay_ms
        self.suspend_current_queue_ms = suspend_current_queue_ms
        self.lock_interval_ms = lock_interval_ms
        self.await_termination_ms = await_termination_ms
        self._listener: Listener | None = None
        self._sem = asyncio.Semaphore(consume_concurrency)
        self._consume_tasks: set[asyncio.Task[None]] = set()
        self._orderly_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._orderly_wakeup: dict[MessageQueue, asyncio.Event] = {}
        self.consumed_count = 0
        self.retry_topic = retry_topic(group)
        self.sent_back_count = 0  # messages handed back to the broker (retry topic or DLQ)

    # --- listeners ------------------------------------------------------------------------------------
    def on_message(self, listener: Listener) -> Listener:
        """Register a concurrent listener (usable as a decorator)."""
        self._set_listener(listener, orderly=False)
        return listener

    def on_message_orderly(self, listener: Listener) -> Listener:
        """Register an orderly listener: per queue, one call at a time, in offset order."""
        self._set_listener(listener, orderly=True)
        return listener

    def _set_listener(self, listener: Listener, *, orderly: bool) -> None:
        if self._started:
            raise ClientStateError("register the listener before start()")
        if self._listener is not None:
            raise ClientStateError("a listener is registered already")
        self._listener = listener
        self.orderly = orderly
        if not orderly and self.max_span_per_queue == 0:
            self.max_span_per_queue = 2000  # RocketMQ's consumeConcurrentlyMaxSpan

    def _check_ready(self) -> None:
        if self._listener is None:
            raise ClientStateError("register a listener (on_message / on_message_orderly) before start()")
        if not self.subscriptions:
            raise ClientStateError("subscribe to a topic before start()")

    def assignment(self, *, include_retry: bool = False) -> set[MessageQueue]:
        """The queues of the subscribed topics this member consumes now; with ``include_retry``
        also the group's retry queue it consumes (CLUSTERING)."""
        queues = super().assignment()
        return queues if include_retry else {q for q in queues if q.topic != self.retry_topic}

    @property
    def effective_max_reconsume_times(self) -> int:
        """``max_reconsume_times``, -1 resolved as RocketMQ does: 16 for a concurrent listener,
        unlimited (-1) for an orderly one."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return -1 if self.orderly else DEFAULT_MAX_RECONSUME_TIMES

    async def start(self) -> None:
        # CLUSTERING members consume their group's retry topic too (RocketMQ's copySubscription).
        if self.clustering and not self._started and not self._closed and self._listener is not None:
            self.subscriptions.setdefault(self.retry_topic, parse_subscription(self.retry_topic, "*"))
        await super().start()

    async def _wanted_queues(self, topic: str) -> set[MessageQueue] | None:
        try:
            return await super()._wanted_queues(topic)
        except RouteNotFoundError:
            if topic == self.retry_topic:  # created by our first heartbeat: look again soon
                asyncio.get_running_loop().call_later(QUICK_REBALANCE_MS / 1000, self.request_rebalance)
            raise

    async def send_back(self, mq: MessageQueue, msg: MessageExt, delay_level: int = 0) -> bool:
        """Give ``msg`` back to the broker (CONSUMER_SEND_MSG_BACK): to the retry topic, or with
        ``delay_level`` -1 to the dead-letter queue. False when the broker could not take it."""
        inst = self.instance
        cmd = send_back_request(
            msg, self.group, delay_level=delay_level, max_reconsume_times=self.effective_max_reconsume_times
        )
        try:
            addr = await inst.broker_addr(mq, master_only=True)
            protocol.check(await inst.invoke(addr, cmd), addr)
        except OrbitError as e:
            log.warning("consumer %s: sending %r back failed: %s", self.group, msg, e)
            return False
        self.sent_back_count += 1
        return True

    def _made_on_heartbeat(self) -> frozenset[str]:
        return frozenset({self.retry_topic}) if self.clustering else frozenset()

    def _extra_tasks(self) -> list[asyncio.Task[None]]:
        if self.orderly and self.clustering:
            return [asyncio.create_task(self._lock_loop(), name=f"orbit-lock-{self.group}")]
        return []

    async def _call_listener(self, msgs: list[MessageExt]) -> ConsumeResult:
        assert self._listener is not None
        try:
            r: object = self._listener(msgs)
            if inspect.isawaitable(r):
                r = await r
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self.telemetry is not None:
                from opentelemetry import trace

                trace.get_current_span().record_exception(e)
            log.exception("consumer %s: listener raised on %d message(s) of %s", self.group, len(msgs), msgs[0])
            return ConsumeResult.RECONSUME_LATER if not self.orderly else ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if not isinstance(r, ConsumeResult):
            log.error("consumer %s: listener returned %r, not a ConsumeResult; consuming again later", self.group, r)
            return ConsumeResult.RECONSUME_LATER
        return r

    async def _call_traced(self, msgs: list[MessageExt]) -> ConsumeResult:
        """``_call_listener`` inside a ``process`` span (telemetry on)."""
        from sdk import telemetry as t

        assert self.telemetry is not None
        model = self.message_model.value
        with t.consumer_span(self.telemetry, msgs, self.group, operation="process", consumption_model=model) as span:
            result = await self._call_listener(msgs)
            t.record_consume_result(span, result.value)
        return result

    async def _on_messages(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if mq.topic == self.retry_topic:
            restore_retry_topics(msgs, self.retry_topic)
        if self.orderly:
            ev = self._orderly_wakeup.get(mq)
            if ev is not None:
                ev.set()
            return
        for i in range(0, len(msgs), self.consume_batch_size):
            self._submit(mq, pq, msgs[i : i + self.consume_batch_size], 0.0)

    # --- concurrent consumption ---------------------------------------------------------------------------
    def _submit(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], delay_s: float) -> None:
        task = asyncio.create_task(self._consume_concurrently(mq, pq, msgs, delay_s))
        self._consume_tasks.add(task)
        task.add_done_callback(self._consume_tasks.discard)

    async def _consume_concurrently(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], delay_s: float
    ) -> None:
        if delay_s > 0:
            await wait_event(self._stop, delay_s)
        async with self._sem:
            if pq.dropped or self._stop.is_set():
                return  # not consumed: it comes back from the committed offset
            result = await (self._call_listener(msgs) if self.telemetry is None else self._call_traced(msgs))
        if pq.is_dropped():
            return  # the queue moved to another member, which starts from the committed offset
        if result is ConsumeResult.SUCCESS:
            self.consumed_count += len(msgs)
            self._committed(mq, pq.remove(msgs))
            return
        again: list[MessageExt] = []
        skipped: list[MessageExt] = []
        if self.clustering:  # the broker redelivers it through the retry topic (or parks it in the DLQ)
            sent = [m for m in msgs if not self._stop.is_set() and await self.send_back(mq, m)]
            if sent:
                self._committed(mq, pq.remove(sent))
            msgs = [m for m in msgs if m not in sent]
        limit = self.effective_max_reconsume_times
        for m in msgs:
            m.reconsume_times += 1
            if 0 <= limit < m.reconsume_times and not self.clustering:
                skipped.append(m)
            else:
                again.append(m)
        if skipped:
            for m in skipped:
                log.error(
                    "consumer %s: %r failed %d times; skipping it (no dead-letter queue yet)",
                    self.group, m, m.reconsume_times,
                )  # fmt: skip
            self._committed(mq, pq.remove(skipped))
        if again and not self._stop.is_set():
            self._submit(mq, pq, again, self.reconsume_delay_ms / 1000)

    def _committed(self, mq: MessageQueue, offset: int) -> None:
        if offset >= 0:
            self.offset_store.update(mq, offset)

    def _stop_grace_s(self) -> float:
        return super()._stop_grace_s() + self.await_termination_ms / 1000  # plus a listener call in flight

    async def _finish_consuming(self) -> None:
        tasks = list(self._consume_tasks) + list(self._orderly_tasks.values())
        for ev in self._orderly_wakeup.values():
            ev.set()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.await_termination_ms / 1000)
            for t in late:
                t.cancel()

    # --- orderly consumption ------------------------------------------------------------------------------
    async def _before_add(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        if not self.orderly:
            return True
        if self.clustering:
            locked = await self.lock([mq])
            if mq not in locked:
                log.info("consumer %s: %s is locked by another member; will retry", self.group, mq)
                return False
            pq.locked = True
            pq.last_lock_ms = monotonic_ms()
        ev = asyncio.Event()
        self._orderly_wakeup[mq] = ev
        self._orderly_tasks[mq] = asyncio.create_task(self._consume_orderly(mq, pq, ev), name=f"orbit-orderly-{mq}")
        return True

    async def _queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        ev = self._orderly_wakeup.pop(mq, None)
        if ev is not None:
            ev.set()
        task = self._orderly_tasks.pop(mq, None)
        if task is not None:  # let the batch in flight finish and commit before the offset is persisted
            done, _ = await asyncio.wait([task], timeout=self.await_termination_ms / 1000)
            if not done:
                task.cancel()

    async def _queue_released(self, mq: MessageQueue) -> None:
        if self.orderly and self.clustering:
            await self.unlock([mq])

    async def _before_leave(self) -> None:
        if self.orderly and self.clustering and self._pqs:
            await self.unlock(list(self._pqs))

    async def _may_pull(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        if self.orderly and self.clustering and not pq.locked:
            await wait_event(self._stop, self.pull_retry_delay_ms / 1000)
            return False
        return await super()._may_pull(mq, pq)

    async def _consume_orderly(self, mq: MessageQueue, pq: ProcessQueue, wakeup: asyncio.Event) -> None:
        suspend_s = self.suspend_current_queue_ms / 1000
        while not pq.dropped and not self._stop.is_set():
            await wakeup.wait()
            wakeup.clear()
            while not pq.dropped and not self._stop.is_set():
                if self.clustering and not pq.can_consume_orderly():
                    if mq not in await self.lock([mq]):
                        await wait_event(self._stop, suspend_s)
                        continue
                    pq.locked = True
                    pq.last_lock_ms = monotonic_ms()
                msgs = pq.take(self.consume_batch_size)
                if not msgs:
                    break
                result = await (self._call_listener(msgs) if self.telemetry is None else self._call_traced(msgs))
                if result is ConsumeResult.SUCCESS:
                    self.consumed_count += len(msgs)
                    self._committed(mq, pq.commit())
                    continue
                limit = self.effective_max_reconsume_times
                if 0 <= limit <= min(m.reconsume_times for m in msgs) and await self._park_in_dlq(mq, msgs):
                    self._committed(mq, pq.commit())  # retried in place max times: the queue moves on
                    continue
                pq.rollback(msgs)
                for m in msgs:
                    m.reconsume_times += 1
                await wait_event(self._stop, suspend_s)

    async def _park_in_dlq(self, mq: MessageQueue, msgs: list[MessageExt]) -> bool:
        """Orderly, CLUSTERING: send messages retried in place max times to the dead-letter queue
        (each once, should a batch be retried because one of them could not go). False when
        one could not go (or in BROADCASTING mode: no DLQ there, the retries go on)."""
        if not self.clustering:
            return False
        ok = True
        for m in msgs:
            if m.extra.get(_SENT_TO_DLQ):
                continue
            if await self.send_back(mq, m, DELAY_LEVEL_DLQ):
                m.extra[_SENT_TO_DLQ] = True
            else:
                ok = False
        return ok

    # --- broker locks ----------------------------------------------------------------------------------------
    async def lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ on each queue's broker; the queues this member now holds."""
        inst = self.instance
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        locked: set[MessageQueue] = set()
        for qs in by_broker.values():
            try:
                addr = await inst.broker_addr(qs[0], master_only=True)
                resp = await inst.invoke(addr, protocol.lock_batch_request(self.group, inst.client_id, qs))
                locked |= protocol.parse_lock_batch_response(resp, addr)
            except OrbitError as e:
                log.warning("consumer %s: locking %s failed: %s", self.group, ", ".join(map(str, qs)), e)
        return locked

    async def unlock(self, mqs: list[MessageQueue]) -> None:
        inst = self.instance
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for qs in by_broker.values():
            try:
                addr = await inst.broker_addr(qs[0], master_only=True)
                cmd = protocol.lock_batch_request(self.group, inst.client_id, qs, unlock=True)
                protocol.check(await inst.invoke(addr, cmd), addr)
            except OrbitError as e:
                log.warning("consumer %s: unlocking %s failed: %s", self.group, ", ".join(map(str, qs)), e)

    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lock_interval_ms / 1000)
            try:
                await self.lock_all()
            except Exception:
                log.exception("consumer %s: renewing locks failed", self.group)

    async def lock_all(self) -> None:
        """Renew the locks on every assigned queue; a queue whose lock is lost stops consuming."""
        pqs = dict(self._pqs)
        if not pqs:
            return
        locked = await self.lock(list(pqs))
        now = monotonic_ms()
        for mq, pq in pqs.items():
            if mq in locked:
                was = pq.locked
                pq.locked = True
                pq.last_lock_ms = now
                if not was:
                    ev = self._orderly_wakeup.get(mq)
                    if ev is not None:
                        ev.set()
            else:
                if pq.locked:
                    log.warning("consumer %s: lost the lock on %s", self.group, mq)
                pq.locked = False
