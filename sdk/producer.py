"""Producer: sends messages to a topic's queues (RocketMQ's DefaultMQProducer).

::

    producer = Producer("orders-producer", namesrv_addrs="127.0.0.1:9876")
    await producer.start()
    result = await producer.send(Message("orders", b"...", tags="paid", keys="order-42"))
    await producer.send(msg, sharding_key="order-42")    # ordered per key: same key → same queue
    await producer.shutdown()

A send picks a queue, asks the master broker of its broker name with SEND_MESSAGE_V2 and
returns a ``SendResult``; FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE are
statuses of a message that was stored, not errors.

* Queue choice: round-robin over the topic's write queues, skipping brokers the latency fault
  strategy (``sdk.fault``) marks unavailable; a retry avoids the broker that just failed.
  A ``sharding_key`` picks ``queues[crc32(key) % len(queues)]`` (the same in every process, as
  long as the number of queues does not change); a ``queue_selector(queues, msg)`` picks freely.
* Retries: up to ``retry_times`` more attempts for retriable errors, all within
  ``send_timeout_ms``. A broker answering that the topic's queues changed — a queue it does not
  serve (SYSTEM_ERROR "queueId[N] is illegal": the topic's writeQueueNums shrank), the topic not
  writable (NO_PERMISSION) or not there (TOPIC_NOT_EXIST) — takes the refused queues out of the
  cached route, the retry goes to a writable queue, and the route is fetched again at once (at
  most once a topic per second: ``sdk.route_refresh``); the caller sees no error. Queues added
  to a topic are used from the next route refresh (``route_refresh_interval_ms``).
  A retry can store a message twice (the first attempt may have landed):
  delivery is at least once; ``msg_id`` (UNIQ_KEY) is the same on every attempt, so consumers
  can de-duplicate.
* Flow control: a broker answering FLOW_CONTROL (215, the tenant is over its quota) stored
  nothing; the producer waits the broker's ``retry-after-ms`` and sends again, without using up
  a retry, until ``send_timeout_ms`` runs out — then it raises ``FlowControlError``.
* A topic the name servers do not know is sent through the default topic's (TBW102) route,
  so the broker creates it (autoCreateTopicEnable).
* Telemetry: ``telemetry=`` a ``data_plane.telemetry.Telemetry`` that is on (``sdk.telemetry``)
  makes each send a PRODUCER span and carries its trace context to consumers in the message's
  properties; None (the default) costs one ``is None`` check per send.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Required, TypedDict

from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Waiter
from data_plane.remoting.errors import RemotingError
from data_plane.store.message import topic_of
from sdk import protocol
from sdk.client_instance import ClientInstance, Credentials, acquire_instance
from sdk.errors import (
    BrokerError,
    ClientStateError,
    FlowControlError,
    IllegalArgumentError,
    IllegalMessageError,
    MessageTooLargeError,
    OrbitError,
    RequestTimeoutError,
    from_remoting,
)
from sdk.fault import LATENCY_MAX_MS, Clock, MQFaultStrategy, TopicPublishQueues
from sdk.message import DEFAULT_TOPIC, Message, MessageQueue, SendResult, new_unique_id, new_unique_ids
from sdk.route import MASTER_ID, TopicRoute

if TYPE_CHECKING:
    from data_plane.telemetry import Telemetry

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# FLOW_CONTROL answers one send takes before it fails: each one paces the client's sends to the
# broker (sdk/pacer.py), so the next attempt waits its slot instead of coming straight back.
MAX_FLOW_CONTROL_RETRIES = 3
QueueSelector = Callable[[Sequence[MessageQueue], Message], MessageQueue]


def select_by_sharding_key(queues: Sequence[MessageQueue], key: str) -> MessageQueue:
    """The queue for a sharding key: crc32 of its UTF-8 bytes modulo the number of queues
    (stable across processes and runs, unlike ``hash()``)."""
    if not queues:
        raise IllegalArgumentError("the topic has no write queues")
    return queues[zlib.crc32(key.encode()) % len(queues)]


class _FirstAnswer:
    """The outcome of ``send_async``'s first attempt, taken straight from the connection
    (``Connection.invoke_frame``: ``set_result`` runs in the read that brought the answer) or
    from the answer's future (``take``), into the future ``send_async`` returned. A failure
    hands over to the coroutine path, which retries as ``send`` would."""

    __slots__ = ("addr", "begin", "mq", "msg", "out", "producer", "uid")

    def __init__(
        self,
        producer: Producer,
        out: asyncio.Future[SendResult],
        msg: Message,
        uid: str,
        mq: MessageQueue,
        addr: str,
        begin: float,
    ) -> None:
        self.producer = producer
        self.out = out
        self.msg = msg
        self.uid = uid
        self.mq = mq
        self.addr = addr
        self.begin = begin

    def done(self) -> bool:
        """Whether the answer is no longer wanted (the caller cancelled the send). The
        connection asks before it hands over an answer, a timeout or its loss, and then drops
        the request: a cancelled send stops counting as in flight here."""
        if self.out.done():
            self.producer._pending.discard(self.out)
            return True
        return False

    def take(self, answer: asyncio.Future[RemotingCommand]) -> None:
        if answer.cancelled():
            self.producer._pending.discard(self.out)
            self.out.cancel()
        elif (e := answer.exception()) is not None:
            self.set_exception(e)
        else:
            self.set_result(answer.result())

    def set_result(self, resp: RemotingCommand) -> None:
        producer, out, mq = self.producer, self.out, self.mq
        if out.done():  # (cancelled by its caller)
            producer._pending.discard(out)
            return
        try:
            result = protocol.parse_send_response(resp, mq, self.uid, self.addr)
        except OrbitError as e:
            self._retry(e)
            return
        except Exception as e:  # (never raised into the connection's read)
            producer._pending.discard(out)
            out.set_exception(e)
            return
        if result.message_queue is not mq:  # stored in another queue: this one is read-only
            producer.instance.queue_redirected(mq)
        elapsed = out.get_loop().time() - self.begin
        fault = producer.fault
        if fault.tolerance.items or elapsed >= _FAST_ANSWER_S:
            fault.update(mq.broker_name, int(elapsed * 1000), isolation=False)
        producer._pending.discard(out)
        out.set_result(result)

    def set_exception(self, exception: BaseException) -> None:
        if self.out.done():
            self.producer._pending.discard(self.out)
            return
        if isinstance(exception, RemotingError):
            self._retry(from_remoting(exception))
        elif isinstance(exception, OrbitError):
            self._retry(exception)
        else:
            self.producer._pending.discard(self.out)
            self.out.set_exception(exception)

    def _retry(self, error: OrbitError) -> None:
        # The coroutine path takes over: the same retries, fault marks and deadline as ``send``.
        producer, msg = self.producer, self.msg
        retry = asyncio.ensure_future(
            producer._send(msg.topic, msg, None, self.uid, None, None, failed=(self.mq, error, self.begin))
        )
        retry.add_done_callback(functools.partial(_settle, self.out, producer._pending))


def _settle(
    out: asyncio.Future[SendResult], pending: set[asyncio.Future[SendResult]], done: asyncio.Future[SendResult]
) -> None:
    """``out`` gets ``done``'s outcome (unless its caller cancelled it) and leaves ``pending``."""
    pending.discard(out)
    if out.done():
        return
    if done.cancelled():
        out.cancel()
    elif (e := done.exception()) is not None:
        out.set_exception(e)
    else:
        out.set_result(done.result())


# An answer within this long from a broker the fault strategy has not marked changes nothing
# (``MQFaultStrategy.update``'s own early return): the send path skips the call.
_FAST_ANSWER_S = LATENCY_MAX_MS[2] / 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


class ProducerOptions(TypedDict, total=False):
    """``Producer``'s keyword options, for ``**options`` typing."""

    namesrv_addrs: Required[str | Sequence[str]]
    send_timeout_ms: int
    retry_times: int
    max_message_bytes: int
    send_latency_fault_enable: bool
    instance_name: str
    credentials: Credentials | None
    route_refresh_interval_ms: int
    heartbeat_interval_ms: int
    fault_clock_ms: Clock | None
    telemetry: Telemetry | None


class Producer:
    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        *,
        namesrv_addrs: str | Sequence[str],
        send_timeout_ms: int = 3000,
        retry_times: int = 2,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        send_latency_fault_enable: bool = True,
        instance_name: str = "DEFAULT",
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        route_refresh_interval_ms: int = 30000,
        heartbeat_interval_ms: int = 30000,
        fault_clock_ms: Clock | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        if not group:
            raise IllegalArgumentError("producer group is empty")
        if send_timeout_ms <= 0 or retry_times < 0 or max_message_bytes <= 0:
            raise IllegalArgumentError("send_timeout_ms and max_message_bytes must be > 0, retry_times >= 0")
        self.group = group
        self._send_head = protocol.SendHead(group)  # SEND_MESSAGE_V2 heads, laid out from a template
        self.namesrv_addrs = namesrv_addrs
        self.send_timeout_ms = send_timeout_ms
        self.retry_times = retry_times
        self.max_message_bytes = max_message_bytes
        self.instance_name = instance_name
        self.credentials = credentials
        self.tls = tls  # None: ORBIT_TLS_CA / ORBIT_TLS decide (sdk.client_instance.ClientInstance)
        self.route_refresh_interval_ms = route_refresh_interval_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.fault = MQFaultStrategy(enabled=send_latency_fault_enable, clock_ms=fault_clock_ms)
        self._instance: ClientInstance | None = None
        self._publish: dict[str, tuple[TopicRoute, TopicPublishQueues]] = {}
        self._topics: set[str] = set()
        self._pending: set[asyncio.Future[SendResult]] = set()
        self._closed = False
        # None unless on: the send paths check ``is None`` and nothing else.
        self.telemetry = telemetry if telemetry is not None and telemetry.enabled else None

    # --- life cycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._instance is not None or self._closed:
            raise ClientStateError("producer already started" if self._instance else "producer was shut down")
        inst = await acquire_instance(
            self.namesrv_addrs,
            instance_name=self.instance_name,
            credentials=self.credentials,
            tls=self.tls,
            route_refresh_interval_ms=self.route_refresh_interval_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
        )
        try:
            inst.add_producer(self)
        except BaseException:
            await inst.release()
            raise
        self._instance = inst

    async def shutdown(self) -> None:
        """Wait for sends in flight (``send_async``), unregister, release the client instance."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=self.send_timeout_ms / 1000)
        inst, self._instance = self._instance, None
        if inst is not None:
            inst.remove_producer(self.group)
            if not inst.closed:
                await inst.unregister(producer_group=self.group)
            await inst.release()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    @property
    def instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientStateError("producer is not started" if not self._closed else "producer was shut down")
        return self._instance

    def topics(self) -> Iterable[str]:
        return set(self._topics)

    # --- queues ---------------------------------------------------------------------------------------
    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's write queues, sorted (what sharding keys index into)."""
        return list((await self.instance.publish_route(topic)).publish_queues)

    def _publish_info(self, route: TopicRoute) -> TopicPublishQueues:
        cached = self._publish.get(route.topic)
        if cached is not None and cached[0] is route:
            return cached[1]  # the same route object: the same queues
        info = cached[1] if cached is not None else None
        masters = {name: addr for name, by_id in route.broker_addrs.items() if (addr := by_id.get(MASTER_ID))}
        if info is None or tuple(info.queues) != route.publish_queues:
            start = zlib.crc32(self.instance.client_id.encode()) % 997
            info = TopicPublishQueues(route.publish_queues, start=start, masters=masters)
        else:
            info.masters = masters  # the same queues (the round robin goes on), perhaps new addresses
        self._publish[route.topic] = (route, info)
        return info

    # --- validation ---------------------------------------------------------------------------------------
    def _check_message(self, msg: Message) -> None:
        if not isinstance(msg, Message):
            raise IllegalMessageError(f"expected a Message, got {type(msg).__name__}")
        if len(msg.body) > self.max_message_bytes:
            raise MessageTooLargeError(len(msg.body), self.max_message_bytes)

    # --- sending ------------------------------------------------------------------------------------------
    def send(
        self, msg: Message, *, sharding_key: str | None = None, queue_selector: QueueSelector | None = None
    ) -> Coroutine[Any, Any, SendResult]:
        """Send and wait for the broker's answer (``await producer.send(msg)``). Raises OrbitError
        subclasses; an invalid message raises at once. (A function returning the sending
        coroutine, not a coroutine function: one coroutine less to step through a send.)"""
        if msg.__class__ is not Message or len(msg.body) > self.max_message_bytes:
            self._check_message(msg)  # (raises; a subclass passes)
        uid = new_unique_id()
        if self.telemetry is not None:
            return self._send_traced(self.telemetry, msg, uid, sharding_key, queue_selector)
        return self._send(msg.topic, msg, None, uid, sharding_key, queue_selector)

    async def _send_traced(
        self,
        tel: Telemetry,
        msg: Message,
        uid: str,
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
    ) -> SendResult:
        """``send`` inside a PRODUCER span whose context the sent copy of ``msg`` carries."""
        from sdk import telemetry as t

        carrier: dict[str, str] = {}
        with t.producer_span(tel, msg, carrier, message_id=uid) as span:
            sent = t.with_properties(msg, carrier)

            def build(mq: MessageQueue) -> RemotingCommand:
                return protocol.send_request(
                    group=self.group, msg=sent, queue_id=mq.queue_id, unique_id=uid, born_timestamp_ms=_now_ms()
                )

            try:
                result = await self._send(msg.topic, msg, build, uid, sharding_key, queue_selector)
            except Exception as e:
                t.record_error(span, e)
                raise
            t.record_send_result(span, result)
            return result

    def send_async(
        self,
        msg: Message,
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        callback: Callable[[asyncio.Future[SendResult]], None] | None = None,
    ) -> asyncio.Future[SendResult]:
        """Start a send and return its future at once; ``callback(future)`` runs when it ends.
        Validation errors raise here, not in the future.

        The common send (no sharding key, selector or tracing; the topic's route known and its
        broker's connection open) makes no task: its request is written here and the answer
        resolves the future from a callback, as RocketMQ's SendCallback does. A failed first
        attempt hands over to the coroutine path, which retries it as ``send`` would."""
        if msg.__class__ is not Message or len(msg.body) > self.max_message_bytes:
            self._check_message(msg)
        inst = self.instance
        fut: asyncio.Future[SendResult] | None = None
        if sharding_key is None and queue_selector is None and self.telemetry is None:
            fut = self._first_attempt(inst, msg)  # leaves _pending itself (no callback a send)
        if fut is None:
            fut = asyncio.ensure_future(self.send(msg, sharding_key=sharding_key, queue_selector=queue_selector))
            fut.add_done_callback(self._pending.discard)
        self._pending.add(fut)
        if callback is not None:
            fut.add_done_callback(callback)
        return fut

    def _first_attempt(self, inst: ClientInstance, msg: Message) -> asyncio.Future[SendResult] | None:
        """``send_async``'s request written at once, or None when it needs an await first (no
        route or publish queues cached, no open connection)."""
        topic = msg.topic
        route = inst.routes.get(topic)
        cached = self._publish.get(topic)
        if route is None or cached is None or cached[0] is not route:
            return None
        info = cached[1]
        mq = self.fault.select(info, None)
        addr = info.masters.get(mq.broker_name)
        if addr is None or inst.pacer.paced(addr):
            return None
        uid = new_unique_id()
        born_ms = _now_ms()
        loop = asyncio.get_running_loop()
        out: asyncio.Future[SendResult] = loop.create_future()
        waiter = _FirstAnswer(self, out, msg, uid, mq, addr, loop.time())
        self._topics.add(topic)
        if self._laid_out(inst, addr, msg, mq.queue_id, uid, born_ms, self.send_timeout_ms, waiter):
            return out
        cmd = protocol.send_request(
            group=self.group, msg=msg, queue_id=mq.queue_id, unique_id=uid, born_timestamp_ms=born_ms
        )
        answer = inst.invoke_raw(addr, cmd, self.send_timeout_ms)
        if not isinstance(answer, asyncio.Future):
            answer = asyncio.ensure_future(answer)  # (a connection being made, or credentials to fetch)
        answer.add_done_callback(waiter.take)
        return out

    def _laid_out(
        self, inst: ClientInstance, addr: str, msg: Message, queue_id: int, uid: str, born_ms: int,
        timeout_ms: int, waiter: Waiter,
    ) -> bool:  # fmt: skip
        """Write ``msg``'s SEND_MESSAGE_V2 laid out from the group's template (``SendHead``) on
        the open connection to ``addr`` (with a bearer token's field, if any), its outcome to
        ``waiter``; False (nothing written) when there is no such connection, the credentials
        sign each request, or the message needs the command path."""
        open_conn = inst.send_connection(addr)
        if open_conn is None:
            return False
        conn, auth = open_conn
        opaque = conn.next_opaque()
        head = self._send_head.frame(msg, opaque, queue_id, uid, born_ms, auth)
        if head is None:
            return False
        conn.invoke_frame(opaque, RequestCode.SEND_MESSAGE_V2, head, msg.body, timeout_ms, waiter)
        return True

    async def send_oneway(
        self, msg: Message, *, sharding_key: str | None = None, queue_selector: QueueSelector | None = None
    ) -> None:
        """Send without waiting for an answer (no result, no retry; a lost message goes unnoticed)."""
        self._check_message(msg)
        inst = self.instance
        self._topics.add(msg.topic)
        if self.telemetry is not None:
            from sdk import telemetry as t

            uid = new_unique_id()
            carrier: dict[str, str] = {}
            with t.producer_span(self.telemetry, msg, carrier, message_id=uid) as span:
                sent = t.with_properties(msg, carrier)
                try:
                    await self._send_oneway(inst, msg, sent, uid, sharding_key, queue_selector)
                except Exception as e:
                    t.record_error(span, e)
                    raise
            return
        await self._send_oneway(inst, msg, msg, new_unique_id(), sharding_key, queue_selector)

    async def _send_oneway(
        self,
        inst: ClientInstance,
        msg: Message,
        sent: Message,
        uid: str,
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
    ) -> None:
        route = await inst.publish_route(msg.topic)
        mq = self._choose(route, msg, sharding_key, queue_selector, None)
        addr = await inst.broker_addr(mq, master_only=True)
        cmd = protocol.send_request(
            group=self.group, msg=sent, queue_id=mq.queue_id, unique_id=uid, born_timestamp_ms=_now_ms()
        )
        await inst.invoke_oneway(addr, cmd)

    async def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
    ) -> SendResult:
        """Send several messages of one topic in one request (SEND_BATCH_MESSAGE); they are stored
        together, in order, in one queue. ``msg_ids`` of the result lists their ids."""
        msgs = list(msgs)
        if not msgs:
            raise IllegalMessageError("the batch is empty")
        topic = getattr(msgs[0], "topic", None)
        if set(map(type, msgs)) != {Message} or set(map(topic_of, msgs)) != {topic}:  # the common case at C speed
            for m in msgs:
                if not isinstance(m, Message):
                    raise IllegalMessageError(f"expected Messages, got {type(m).__name__}")
                if m.topic != topic:
                    raise IllegalMessageError(f"a batch holds one topic: {topic!r} and {m.topic!r}")
        uids = new_unique_ids(len(msgs))
        if self.telemetry is not None:
            return await self._send_batch_traced(self.telemetry, msgs, uids, sharding_key, queue_selector)
        return await self._send_batch(msgs, msgs, uids, sharding_key, queue_selector)

    async def _send_batch(
        self,
        msgs: list[Message],
        sent: list[Message],
        uids: list[str],
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
    ) -> SendResult:
        body = protocol.batch_body(sent, uids)  # built once: the size check and every attempt use it
        if len(body) > self.max_message_bytes:
            raise MessageTooLargeError(len(body), self.max_message_bytes)

        def build(mq: MessageQueue) -> RemotingCommand:
            return protocol.send_batch_request(
                group=self.group,
                msgs=sent,
                queue_id=mq.queue_id,
                unique_ids=uids,
                born_timestamp_ms=_now_ms(),
                body=body,
            )

        return await self._send(
            msgs[0].topic, msgs[0], build, ",".join(uids), sharding_key, queue_selector, n_msgs=len(msgs)
        )

    async def _send_batch_traced(
        self,
        tel: Telemetry,
        msgs: list[Message],
        uids: list[str],
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
    ) -> SendResult:
        """One PRODUCER span for the batch; every message carries its context."""
        from sdk import telemetry as t

        carrier: dict[str, str] = {}
        with t.producer_span(tel, msgs[0], carrier, message_id="", batch_size=len(msgs)) as span:
            try:
                result = await self._send_batch(
                    msgs, [t.with_properties(m, carrier) for m in msgs], uids, sharding_key, queue_selector
                )
            except Exception as e:
                t.record_error(span, e)
                raise
            t.record_send_result(span, result)
            return result

    def _choose(
        self,
        route: TopicRoute,
        msg: Message,
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
        last_broker: str | None,
    ) -> MessageQueue:
        queues = route.publish_queues
        if sharding_key is not None:
            return select_by_sharding_key(queues, sharding_key)
        if queue_selector is not None:
            mq = queue_selector(queues, msg)
            if mq not in queues:
                raise IllegalArgumentError(f"queue_selector returned {mq}, not one of the topic's write queues")
            return mq
        return self.fault.select(self._publish_info(route), last_broker)

    async def _send(
        self,
        topic: str,
        msg: Message,
        build: Callable[[MessageQueue], RemotingCommand] | None,
        msg_id: str,
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
        *,
        failed: tuple[MessageQueue, OrbitError, float] | None = None,
        n_msgs: int = 1,
    ) -> SendResult:
        """Send what ``build(queue)`` makes — ``msg`` itself when ``build`` is None — with the
        retries and fault strategy of every send. ``failed``: a first attempt already made
        (``send_async``'s: its queue, its error and when it began), handled as if made here."""
        inst = self.instance
        self._topics.add(topic)
        loop = asyncio.get_running_loop()
        begin = loop.time() if failed is None else failed[2]
        deadline = begin + self.send_timeout_ms / 1000
        fault = self.fault
        fresh = failed is None  # nothing awaited since ``begin`` was read: it is still the time
        last_broker: str | None = None
        last_error: OrbitError | None = None
        refresh = False
        attempt = 0
        flow_controlled = 0
        addr: str | None = None
        while attempt <= self.retry_times:
            if failed is not None:
                mq = failed[0]
            else:
                route = None if refresh else inst.routes.get(topic)
                if route is None or not route.publish_queues:
                    route = await inst.publish_route(topic, refresh=refresh)
                    fresh = False
                if sharding_key is None and queue_selector is None:
                    cached = self._publish.get(topic)  # (_publish_info's cache, looked at inline)
                    info = cached[1] if cached is not None and cached[0] is route else self._publish_info(route)
                    mq = fault.select(info, last_broker)
                    addr = info.masters.get(mq.broker_name)
                else:
                    mq = self._choose(route, msg, sharding_key, queue_selector, last_broker)
                    addr = None
                if not fresh:
                    begin = loop.time()
                fresh = False
                remaining_ms = int((deadline - begin) * 1000)
                if remaining_ms <= 0:
                    break
            last_broker = mq.broker_name
            try:
                if failed is not None:
                    error, failed = failed[1], None
                    raise error  # the attempt send_async made: its failure is handled below
                if addr is None:
                    addr = inst.cached_master_addr(mq) or await inst.broker_addr(mq, master_only=True)
                if inst.pacer.paced(addr):
                    await self._paced(inst, addr, deadline, n_msgs)
                answer: Awaitable[RemotingCommand]
                if build is not None:
                    answer = inst.invoke_raw(addr, build(mq), remaining_ms)
                else:
                    born_ms = _now_ms()
                    answer = loop.create_future()
                    if not self._laid_out(inst, addr, msg, mq.queue_id, msg_id, born_ms, remaining_ms, answer):
                        cmd = protocol.send_request(
                            group=self.group, msg=msg, queue_id=mq.queue_id, unique_id=msg_id, born_timestamp_ms=born_ms
                        )
                        answer = inst.invoke_raw(addr, cmd, remaining_ms)
                try:
                    resp = await answer
                except RemotingError as e:
                    raise from_remoting(e) from e
                result = protocol.parse_send_response(resp, mq, msg_id, addr)
                if result.message_queue is not mq:  # stored in another queue: this one is read-only
                    inst.queue_redirected(mq)
            except FlowControlError as e:
                # Over quota: not the broker's fault and not an attempt used up. The pacer holds
                # this and the client's other sends to the broker to the tenant's rate there.
                if e.local:
                    raise
                last_error = e
                if addr is not None and e.quota_msgs_per_s:  # a rate to pace to (not a full disk)
                    inst.pacer.refused(addr, loop.time(), e.retry_after_ms, e.quota_msgs_per_s, begin)
                    flow_controlled += 1
                    if flow_controlled > MAX_FLOW_CONTROL_RETRIES:
                        raise
                    continue
                wait_s = min(e.retry_after_ms / 1000, deadline - loop.time())
                if wait_s <= 0:
                    break
                await asyncio.sleep(wait_s)
                continue
            except OrbitError as e:
                attempt += 1
                if e.invalid_metadata and isinstance(e, BrokerError):
                    # The broker answered that the topic's queues changed (not that it is slow or
                    # away): the retry goes to a queue the trimmed route still lists, while the
                    # route is fetched again (at most once a topic per short interval).
                    inst.route_stale(mq, e)
                    refresh = False
                else:
                    self.fault.update(mq.broker_name, int((loop.time() - begin) * 1000), isolation=True)
                    refresh = e.invalid_metadata
                if not e.retriable:
                    raise
                log.info("send to %s failed (attempt %d): %s", mq, attempt, e)
                last_error = e
                continue
            if addr is not None:
                inst.pacer.granted(addr)
            if fault.tolerance.items or loop.time() - begin >= _FAST_ANSWER_S:
                fault.update(mq.broker_name, int((loop.time() - begin) * 1000), isolation=False)
            return result
        if last_error is not None and (loop.time() < deadline or isinstance(last_error, FlowControlError)):
            raise last_error
        raise RequestTimeoutError(
            f"send to {topic!r} did not succeed within send_timeout_ms={self.send_timeout_ms}"
            + (f" (last error: {last_error})" if last_error else "")
        )

    @staticmethod
    async def _paced(inst: ClientInstance, addr: str, deadline: float, n_msgs: int) -> None:
        """Wait for this send's slot in the pace of a broker that refused the tenant's sends
        (sdk/pacer.py); FlowControlError, nothing sent, when the slot is past the deadline."""
        loop = asyncio.get_running_loop()
        wait_s = inst.pacer.slot(addr, loop.time(), deadline, n_msgs)
        if wait_s is None:
            raise FlowControlError.held_back(addr)
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    # --- administration ---------------------------------------------------------------------------------
    async def create_topic(self, topic: str, *, queue_nums: int = 4, perm: int = 6) -> list[str]:
        """Create (or update) a topic on every master broker that serves the default topic
        (UPDATE_AND_CREATE_TOPIC); returns the broker names. For tools and tests."""
        inst = self.instance
        route = await inst.route(DEFAULT_TOPIC, refresh=True)
        done: list[str] = []
        for name in route.brokers():
            addr = route.master_addr(name)
            if addr is None:
                continue
            resp = await inst.invoke(addr, protocol.create_topic_request(topic, queue_nums=queue_nums, perm=perm))
            protocol.check(resp, addr)
            done.append(name)
        # The brokers tell the name servers at once, but asynchronously: wait (briefly) until the
        # route has the topic, so a send right after this does not take the default topic's
        # queues (and a queue id the new topic does not have).
        deadline = time.monotonic() + 3.0
        while done and time.monotonic() < deadline:
            with contextlib.suppress(OrbitError):
                known = await inst.fetch_route(topic)
                if known is not None and set(done) <= set(known.brokers()):
                    break
            await asyncio.sleep(0.05)
        return done
