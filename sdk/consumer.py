"""What push and pull consumers share: group membership, queue assignment and the pull loops.

``ConsumerBase`` owns, for one consumer group member:

* the client instance (heartbeats carry this member's ``consumer_data``) and the offset store
  (remote for CLUSTERING, a local file for BROADCASTING);
* rebalancing — every ``rebalance_interval_ms``, at once when a broker says the group changed
  (NOTIFY_CONSUMER_IDS_CHANGED) or a route refresh changed a subscribed topic's route (queues
  added or removed): for each subscribed topic, the topic's read queues and the group's client
  ids go through the allocation strategy (BROADCASTING takes every queue); queues no longer ours
  are dropped (their offsets persisted first), new ones start. A pull answered that its queue
  is not served (SYSTEM_ERROR "queueId[N] is illegal", TOPIC_NOT_EXIST) asks for the topic's
  route at once and waits, quietly, for the rebalance to drop the queue;
* one pull loop per assigned queue: a long-poll PULL_MESSAGE (the broker holds it up to
  ``pull_suspend_ms`` when there is nothing new), the exact tag re-check, the ``ProcessQueue``
  cache with flow control (the loop waits while the cache is over its limits), and
  ``_on_messages`` — what a subclass does with what arrived;
* where a new queue starts: the group's committed offset; without one (QUERY_NOT_FOUND) the
  queue's max offset for LAST_OFFSET, its min offset for FIRST_OFFSET, or the offset of
  ``consume_timestamp_ms`` for TIMESTAMP.

Subclasses: ``PushConsumer`` (listeners) and ``PullConsumer`` (``poll``). ``telemetry=`` (a
``data_plane.telemetry.Telemetry`` that is on) gives their listener calls and polls spans
(``sdk.telemetry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import ssl
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Required, TypedDict, TypeVar

from data_plane.remoting import bodies
from data_plane.remoting.codes import RequestCode
from data_plane.tasks import cancel_all
from sdk import protocol
from sdk.aio import wait_event
from sdk.client_instance import ClientInstance, Credentials, acquire_instance
from sdk.errors import (
    ClientStateError,
    FlowControlError,
    IllegalArgumentError,
    OrbitError,
    QueueNotServedError,
    RouteNotFoundError,
    TopicNotExistError,
)
from sdk.message import MessageExt, MessageQueue
from sdk.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from sdk.process_queue import ProcessQueue
from sdk.protocol import PullStatus
from sdk.rebalance import AllocateAveragely, AllocateStrategy
from sdk.subscription import MessageSelector, Subscription, parse_subscription

if TYPE_CHECKING:
    from data_plane.telemetry import Telemetry

log = logging.getLogger(__name__)

DEFAULT_MAX_CACHED_BYTES = 100 * 1024 * 1024
QUICK_REBALANCE_MS = 1000  # retry soon when a queue could not be taken (orderly lock held elsewhere)
FLOW_CONTROL_WAIT_S = 0.05


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"  # each message to one member of the group
    BROADCASTING = "BROADCASTING"  # each message to every member


class ConsumeFrom(enum.Enum):
    """Where a group with no committed offset on a queue starts."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


E = TypeVar("E", bound=enum.Enum)


def _enum_option(cls: type[E], value: E | str, option: str) -> E:
    if isinstance(value, cls):
        return value
    text = str(value).upper()
    for member in cls:
        if text in (member.name, str(member.value)):
            return member
    raise IllegalArgumentError(f"{option}={value!r}: expected one of {[m.name for m in cls]}")


class ConsumerOptions(TypedDict, total=False):
    """The options every consumer takes (see ``ConsumerBase``), for ``**options`` typing."""

    namesrv_addrs: Required[str | Sequence[str]]
    message_model: MessageModel | str
    allocate: AllocateStrategy | None
    consume_from: ConsumeFrom | str
    consume_timestamp_ms: int | None
    pull_batch_size: int
    max_cached_messages_per_queue: int
    max_cached_bytes_per_queue: int
    max_span_per_queue: int
    pull_suspend_ms: int
    pull_retry_delay_ms: int
    rebalance_interval_ms: int
    heartbeat_interval_ms: int
    route_refresh_interval_ms: int
    persist_interval_ms: int
    request_timeout_ms: int
    instance_name: str | None
    credentials: Credentials | None
    offset_store_dir: str | os.PathLike[str] | None
    check_crc: bool
    telemetry: Telemetry | None


class ConsumerBase:
    consume_type = "CONSUME_PASSIVELY"
    orderly = False

    def __init__(
        self,
        group: str,
        *,
        namesrv_addrs: str | Sequence[str],
        message_model: MessageModel | str = MessageModel.CLUSTERING,
        allocate: AllocateStrategy | None = None,
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        pull_batch_size: int = 32,
        max_cached_messages_per_queue: int = 1000,
        max_cached_bytes_per_queue: int = DEFAULT_MAX_CACHED_BYTES,
        max_span_per_queue: int = 0,
        pull_suspend_ms: int = 15000,
        pull_retry_delay_ms: int = 3000,
        rebalance_interval_ms: int = 20000,
        heartbeat_interval_ms: int = 30000,
        route_refresh_interval_ms: int = 30000,
        persist_interval_ms: int = 5000,
        request_timeout_ms: int = 3000,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        offset_store_dir: str | os.PathLike[str] | None = None,
        check_crc: bool = True,
        telemetry: Telemetry | None = None,
    ) -> None:
        if not group:
            raise IllegalArgumentError("consumer group is empty")
        for name, v in (
            ("pull_batch_size", pull_batch_size),
            ("max_cached_messages_per_queue", max_cached_messages_per_queue),
            ("max_cached_bytes_per_queue", max_cached_bytes_per_queue),
            ("rebalance_interval_ms", rebalance_interval_ms),
            ("heartbeat_interval_ms", heartbeat_interval_ms),
            ("persist_interval_ms", persist_interval_ms),
            ("request_timeout_ms", request_timeout_ms),
        ):
            if v <= 0:
                raise IllegalArgumentError(f"{name} must be > 0, got {v}")
        if pull_suspend_ms < 0 or pull_retry_delay_ms < 0:
            raise IllegalArgumentError("pull_suspend_ms and pull_retry_delay_ms must be >= 0")
        self.group = group
        self.namesrv_addrs = namesrv_addrs
        self.message_model = _enum_option(MessageModel, message_model, "message_model")
        self.allocate = allocate if allocate is not None else AllocateAveragely()
        self.consume_from = _enum_option(ConsumeFrom, consume_from, "consume_from")
        if self.consume_from is ConsumeFrom.TIMESTAMP and consume_timestamp_ms is None:
            consume_timestamp_ms = int(time.time() * 1000) - 30 * 60 * 1000  # RocketMQ's default: 30 min ago
        self.consume_timestamp_ms = consume_timestamp_ms
        self.pull_batch_size = pull_batch_size
        self.max_cached_messages_per_queue = max_cached_messages_per_queue
        self.max_cached_bytes_per_queue = max_cached_bytes_per_queue
        self.max_span_per_queue = max_span_per_queue
        self.pull_suspend_ms = pull_suspend_ms
        self.pull_retry_delay_ms = pull_retry_delay_ms
        self.rebalance_interval_ms = rebalance_interval_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.route_refresh_interval_ms = route_refresh_interval_ms
        self.persist_interval_ms = persist_interval_ms
        self.request_timeout_ms = request_timeout_ms
        self.instance_name = instance_name or "DEFAULT"
        self.credentials = credentials
        self.tls = tls  # None: ORBIT_TLS_CA / ORBIT_TLS decide (sdk.client_instance.ClientInstance)
        self.offset_store_dir = offset_store_dir
        self.check_crc = check_crc
        # None unless on (sdk.telemetry): listener calls and polls check ``is None`` and nothing else.
        self.telemetry = telemetry if telemetry is not None and telemetry.enabled else None
        self.subscriptions: dict[str, Subscription] = {}
        self._instance: ClientInstance | None = None
        self._offsets: OffsetStore | None = None
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_task: asyncio.Task[None] | None = None
        self._rebalance_wakeup = asyncio.Event()
        self._stop = asyncio.Event()
        self._started = False
        self._closed = False
        self._pulls_in_flight = 0
        self.pulls_sent = 0  # PULL_MESSAGE requests sent (statistics, tests)
        self.rebalance_count = 0

    # --- configuration -------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | MessageSelector = "*", *, sql: str | None = None) -> None:
        """Consume ``topic``'s messages whose tag matches ``expression`` ("*" or "TagA || TagB"),
        or whose properties match a SQL92 expression (``MessageSelector.sql(...)`` or ``sql=``; a
        bad one raises IllegalArgumentError here, naming the position). Call before ``start``."""
        if self._started:
            raise ClientStateError("subscribe before start()")
        self.subscriptions[topic] = parse_subscription(topic, expression, sql=sql)

    # --- ConsumerMember (for the client instance) -----------------------------------------------------
    def topics(self) -> Iterable[str]:
        return list(self.subscriptions)

    def consumer_data(self) -> bodies.ConsumerData:
        return {
            "groupName": self.group,
            "consumeType": self.consume_type,
            "messageModel": self.message_model.value,
            "consumeFromWhere": self.consume_from.value,
            "subscriptionDataSet": [s.to_wire() for s in self.subscriptions.values()],
            "unitMode": False,
        }

    def request_rebalance(self) -> None:
        self._rebalance_wakeup.set()

    # --- state ---------------------------------------------------------------------------------------
    @property
    def instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientStateError("consumer is not started" if not self._closed else "consumer was shut down")
        return self._instance

    @property
    def offset_store(self) -> OffsetStore:
        if self._offsets is None:
            raise ClientStateError("consumer is not started")
        return self._offsets

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    def assignment(self) -> set[MessageQueue]:
        """The queues this member consumes now."""
        return set(self._pqs)

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    # --- life cycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started or self._closed:
            raise ClientStateError("consumer already started" if self._started else "consumer was shut down")
        self._check_ready()
        inst = await acquire_instance(
            self.namesrv_addrs,
            instance_name=self.instance_name,
            credentials=self.credentials,
            tls=self.tls,
            route_refresh_interval_ms=self.route_refresh_interval_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            request_timeout_ms=self.request_timeout_ms,
        )
        try:
            inst.add_consumer(self, heartbeat_interval_ms=self.heartbeat_interval_ms)
        except BaseException:
            await inst.release()
            raise
        self._instance = inst
        self._started = True
        try:
            if self.clustering:
                self._offsets = RemoteOffsetStore(inst, self.group)
            else:
                self._offsets = LocalOffsetStore(self.offset_store_dir, self.instance_name, self.group)
            await self._offsets.load()
            for topic in self.subscriptions:
                try:
                    await inst.route(topic, refresh=True)
                except OrbitError as e:
                    level = logging.DEBUG if topic in self._made_on_heartbeat() else logging.WARNING
                    log.log(level, "consumer %s: no route for %s yet: %s", self.group, topic, e)
            await self._check_client_config(inst)
            await inst.send_heartbeat_to_all_brokers()
        except BaseException:
            inst.remove_consumer(self.group)
            await inst.release()
            self._instance = None
            self._started = False
            raise
        self._rebalance_task = asyncio.create_task(self._rebalance_loop(), name=f"orbit-rebalance-{self.group}")
        self._tasks = [
            asyncio.create_task(self._persist_loop(), name=f"orbit-persist-{self.group}"),
            *self._extra_tasks(),
        ]
        self.request_rebalance()

    def _made_on_heartbeat(self) -> frozenset[str]:
        """Subscribed topics the broker makes when the first heartbeat names the group (the
        group's retry topic): no route for them at start is expected, found at the next refresh."""
        return frozenset()

    async def _check_client_config(self, inst: ClientInstance) -> None:
        """CHECK_CLIENT_CONFIG (46) for each SQL92 subscription at every master of its topic, as
        RocketMQ clients do: a broker that cannot filter it fails ``start`` with its reason."""
        from data_plane.remoting.command import RemotingCommand
        from sdk.errors import for_code

        for sub in self.subscriptions.values():
            if not sub.is_sql:
                continue
            try:
                route = await inst.route(sub.topic)
            except OrbitError:
                continue  # no route yet: the heartbeat and pulls are checked by the broker too
            body = bodies.dumps({"clientId": inst.client_id, "group": self.group, "subscriptionData": sub.to_wire()})
            for name in route.brokers():
                addr = route.master_addr(name)
                if addr is None:
                    continue
                resp = await inst.invoke(addr, RemotingCommand(RequestCode.CHECK_CLIENT_CONFIG, body=body))
                if resp.code != 0:
                    raise for_code(resp.code, resp.remark, addr)

    def _check_ready(self) -> None:
        """Subclasses refuse to start when not configured."""

    def _extra_tasks(self) -> list[asyncio.Task[None]]:
        return []

    async def shutdown(self) -> None:
        """Stop pulling, let consumption in flight finish, persist offsets, leave the group. A
        queue being handed over by a rebalance at that moment finishes its hand-over (offset
        persisted, orderly lock released), so its next owner takes it at once."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        self._stop.set()
        await cancel_all(self._tasks)
        if self._rebalance_task is not None:
            # A rebalance dropping a queue finishes that step (consumption in flight, offset
            # persisted, lock released) rather than leave the queue half dropped; then it ends.
            self._rebalance_wakeup.set()
            await asyncio.wait([self._rebalance_task], timeout=self._stop_grace_s())
            await cancel_all([self._rebalance_task])
        await cancel_all(self._pull_tasks.values())
        self._pull_tasks.clear()
        await self._finish_consuming()
        inst = self.instance
        try:
            if self._offsets is not None:
                try:
                    await self._offsets.persist(list(self._pqs), sync=True)
                except OrbitError as e:
                    log.warning("consumer %s: persisting offsets at shutdown failed: %s", self.group, e)
            await self._before_leave()
        finally:
            for pq in self._pqs.values():
                pq.drop()
            self._pqs.clear()
            inst.remove_consumer(self.group)
            if not inst.closed:
                await inst.unregister(consumer_group=self.group)
            await inst.release()
            self._instance = None

    def _stop_grace_s(self) -> float:
        """How long ``shutdown`` lets a rebalance step in progress finish before cancelling it:
        an offset to persist and a lock to release, a request each."""
        return 2 * self.request_timeout_ms / 1000 + 1

    async def _finish_consuming(self) -> None:
        """Subclasses wait for the consumption in flight."""

    async def _before_leave(self) -> None:
        """Subclasses release what they hold (orderly locks)."""

    async def __aenter__(self) -> ConsumerBase:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # --- rebalancing -----------------------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        while True:
            await wait_event(self._rebalance_wakeup, self.rebalance_interval_ms / 1000)
            self._rebalance_wakeup.clear()
            if self._stop.is_set():
                return
            try:
                complete = await self.rebalance()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer %s: rebalance failed", self.group)
                complete = False
            if not complete:
                asyncio.get_running_loop().call_later(QUICK_REBALANCE_MS / 1000, self._rebalance_wakeup.set)

    async def _wanted_queues(self, topic: str) -> set[MessageQueue] | None:
        """The queues of ``topic`` this member should have, or None to keep the current ones."""
        inst = self.instance
        route = await inst.route(topic)
        mqs = list(route.subscribe_queues)
        if not self.clustering:
            return set(mqs)
        cids = await inst.consumer_ids(self.group, topic)
        if not cids:
            log.info("consumer %s: broker knows no member of the group yet; keeping the assignment", self.group)
            return None
        return set(self.allocate.allocate(self.group, inst.client_id, mqs, cids))

    async def rebalance(self) -> bool:
        """One rebalance of every subscribed topic; False when it should be retried soon."""
        if self._stop.is_set():
            return True
        self.rebalance_count += 1
        complete = True
        for topic in list(self._topics_to_balance()):
            try:
                wanted = await self._wanted_queues(topic)
            except RouteNotFoundError as e:
                log.warning("consumer %s: %s; will look again in %d ms", self.group, e, self.rebalance_interval_ms)
                continue
            except OrbitError as e:
                log.warning("consumer %s: rebalance of %s failed: %s", self.group, topic, e)
                complete = False
                continue
            if wanted is None:
                continue
            if not await self.update_assignment(topic, wanted):
                complete = False
        return complete

    def _topics_to_balance(self) -> Iterable[str]:
        return self.subscriptions

    async def update_assignment(self, topic: str, wanted: set[MessageQueue]) -> bool:
        """Drop queues of ``topic`` not in ``wanted``, start the new ones. False if some new
        queue could not be started (retried soon)."""
        for mq in sorted(q for q in self._pqs if q.topic == topic and q not in wanted):
            await self._remove_queue(mq)
        complete = True
        for mq in sorted(q for q in wanted if q not in self._pqs):
            if self._stop.is_set():
                break
            if not await self._add_queue(mq):
                complete = False
        return complete

    async def _remove_queue(self, mq: MessageQueue) -> None:
        pq = self._pqs.pop(mq, None)
        if pq is None:
            return
        pq.drop()
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            await cancel_all([task])  # a shutdown cancelling this rebalance meanwhile is not lost
        await self._queue_removed(mq, pq)
        offsets = self.offset_store
        try:
            await offsets.persist([mq], sync=True)
        except OrbitError as e:
            log.warning("consumer %s: persisting the offset of %s failed: %s", self.group, mq, e)
        offsets.remove(mq)
        await self._queue_released(mq)
        log.info("consumer %s: dropped %s", self.group, mq)

    async def _queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Subclasses wait for the queue's consumption in flight before its offset is persisted."""

    async def _queue_released(self, mq: MessageQueue) -> None:
        """Subclasses release the queue's lock after its offset is persisted."""

    async def _before_add(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Subclasses may refuse a queue for now (an orderly consumer that cannot lock it)."""
        return True

    async def _add_queue(self, mq: MessageQueue, start_offset: int | None = None) -> bool:
        pq = ProcessQueue()
        pq.limits = (self.max_cached_messages_per_queue, self.max_cached_bytes_per_queue, self.max_span_per_queue)
        if not await self._before_add(mq, pq):
            return False
        offsets = self.offset_store
        offsets.remove(mq)
        try:
            offset = start_offset if start_offset is not None else await self.compute_pull_from(mq)
        except OrbitError as e:
            log.warning("consumer %s: cannot find where to start %s: %s", self.group, mq, e)
            pq.drop()
            await self._queue_removed(mq, pq)
            await self._queue_released(mq)
            return False
        self._pqs[mq] = pq
        self._start_pulling(mq, pq, offset)
        log.info("consumer %s: took %s from offset %d", self.group, mq, offset)
        return True

    def _start_pulling(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        self._pull_tasks[mq] = asyncio.create_task(self._pull_loop(mq, pq, offset), name=f"orbit-pull-{mq}")

    # --- offsets -------------------------------------------------------------------------------------------
    async def _queue_offset(self, code: RequestCode, mq: MessageQueue) -> int:
        inst = self.instance
        addr = await inst.broker_addr(mq)  # the master, else a slave (reads)
        return protocol.parse_offset_response(await inst.invoke(addr, protocol.queue_offset_request(code, mq)), addr)

    async def max_offset(self, mq: MessageQueue) -> int:
        """The queue's max offset (one past its last message)."""
        return await self._queue_offset(RequestCode.GET_MAX_OFFSET, mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._queue_offset(RequestCode.GET_MIN_OFFSET, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the first message stored at or after ``timestamp_ms``."""
        inst = self.instance
        addr = await inst.broker_addr(mq)  # the master, else a slave (reads)
        resp = await inst.invoke(addr, protocol.search_offset_request(mq, timestamp_ms))
        return protocol.parse_offset_response(resp, addr)

    async def compute_pull_from(self, mq: MessageQueue) -> int:
        """The committed offset; without one, per ``consume_from`` (RocketMQ's rule)."""
        committed = await self.offset_store.read_store(mq)
        if committed is not None and committed >= 0:
            return committed
        if self.consume_from is ConsumeFrom.LAST_OFFSET:
            return await self.max_offset(mq)
        if self.consume_from is ConsumeFrom.FIRST_OFFSET:
            return await self.min_offset(mq)
        assert self.consume_timestamp_ms is not None
        return await self.search_offset(mq, self.consume_timestamp_ms)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_interval_ms / 1000)
            try:
                await self.offset_store.persist(list(self._pqs))
            except Exception:
                log.exception("consumer %s: persisting offsets failed", self.group)

    # --- pulling ------------------------------------------------------------------------------------------
    async def _may_pull(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Whether to pull now; waits a little (flow control) and returns False to look again."""
        if pq.over_limits() is not None:
            await pq.wait_for_room(FLOW_CONTROL_WAIT_S * 20)
            return False
        return True

    async def _on_messages(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        raise NotImplementedError

    def _correct_offset(self, mq: MessageQueue, pq: ProcessQueue, next_offset: int) -> None:
        """Nothing cached: the queue is consumed up to ``next_offset`` (filtered messages
        included), so commit it (RocketMQ's correctTagsOffset)."""
        if pq.count == 0 and pq.consuming == 0:
            self.offset_store.update(mq, next_offset)

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        inst = self.instance
        broker_id = 0
        addr = ""
        timeout_ms = self.pull_suspend_ms + max(self.request_timeout_ms, 5000)
        gone = False  # a pull answered that the queue is not served (logged once)
        while not pq.dropped and not self._stop.is_set():
            if not await self._may_pull(mq, pq):
                continue
            sub = self.subscriptions.get(mq.topic) or parse_subscription(mq.topic, "*", version=0)
            commit = (self.offset_store.read_memory(mq) or 0) if self.clustering else 0
            try:
                addr = await inst.broker_addr(mq, broker_id)
                cmd = protocol.pull_request(
                    group=self.group,
                    mq=mq,
                    offset=offset,
                    max_nums=self.pull_batch_size,
                    subscription=sub.expression,
                    sub_version=sub.version,
                    suspend_timeout_ms=self.pull_suspend_ms,
                    commit_offset=commit,
                    suspend=self.pull_suspend_ms > 0,
                    expression_type=sub.expression_type,
                )
                pq.last_pull_ms = int(time.monotonic() * 1000)
                self._pulls_in_flight += 1
                self.pulls_sent += 1
                try:
                    resp = await inst.invoke(addr, cmd, timeout_ms)
                finally:
                    self._pulls_in_flight -= 1
                result = protocol.parse_pull_response(resp, mq.broker_name, addr, check_crc=self.check_crc)
            except OrbitError as e:
                if pq.dropped or self._stop.is_set():
                    return
                if isinstance(e, FlowControlError):  # over quota: wait as long as the broker says
                    await wait_event(self._stop, e.retry_after_ms / 1000)
                    continue
                if isinstance(e, QueueNotServedError | TopicNotExistError):
                    # The queue is gone from the topic there: the route, fetched again, no longer
                    # lists it and the rebalance that follows drops this loop. Said once.
                    if not gone:
                        gone = True
                        log.info("consumer %s: %s is gone (%s); the route refresh drops it", self.group, mq, e)
                    inst.route_refresh.ask(mq.topic)
                    await wait_event(self._stop, self.pull_retry_delay_ms / 1000)
                    continue
                log.warning("consumer %s: pull of %s failed: %s", self.group, mq, e)
                # Another broker of the group next (a slave while the master is away).
                broker_id = inst.other_broker_id(mq.broker_name, addr) if e.retriable and addr else 0
                await wait_event(self._stop, self.pull_retry_delay_ms / 1000)
                continue
            if pq.is_dropped():
                return
            broker_id = result.suggest_which_broker_id
            if result.status is PullStatus.FOUND:
                msgs = result.messages
                # All of them when offsets (ascending within a pull) start at ours and "*" (or
                # SQL92) keeps every tag; else message by message.
                if sub.tags or (msgs and msgs[0].queue_offset < offset):
                    msgs = [m for m in msgs if m.queue_offset >= offset and sub.matches(m.tags)]
                offset = max(result.next_begin_offset, offset)
                if msgs:
                    pq.put(msgs)
                    await self._on_messages(mq, pq, msgs)
                else:
                    self._correct_offset(mq, pq, offset)
            elif result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                offset = result.next_begin_offset
                self._correct_offset(mq, pq, offset)
            else:  # OFFSET_ILLEGAL: the offset is out of the queue's range; the broker says where to go
                log.warning(
                    "consumer %s: offset %d of %s is illegal (queue holds %d..%d); moving to %d",
                    self.group, offset, mq, result.min_offset, result.max_offset, result.next_begin_offset,
                )  # fmt: skip
                offset = result.next_begin_offset
                pq.clear()
                self.offset_store.update(mq, offset, increase_only=False)
                with contextlib.suppress(OrbitError):
                    await self.offset_store.persist([mq])
