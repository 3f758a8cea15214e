"""PULL_MESSAGE (11): read a queue from an offset, filtered by tag hash, with long polling.

Request ext: consumerGroup topic queueId queueOffset maxMsgNums sysFlag commitOffset
suspendTimeoutMillis subscription subVersion expressionType. Response ext: nextBeginOffset
minOffset maxOffset suggestWhichBrokerId; body: the stored records back to back, handed to the
socket as slices of the CommitLog mapping (no per-message copy).

Store read status → response code (RocketMQ's PullMessageProcessor):

    FOUND                                   SUCCESS
    NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING PULL_RETRY_IMMEDIATELY
    NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE  PULL_NOT_FOUND at offset 0, else PULL_OFFSET_MOVED
    OFFSET_OVERFLOW_ONE, OFFSET_FOUND_NULL   PULL_NOT_FOUND (held when the pull may suspend)
    OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL  PULL_OFFSET_MOVED

Tags are matched by hash here; clients check the tag string again (seed 7.4).

With telemetry on, the broker registers ``traced_pull(handler, ...)``: a SERVER span
``receive <topic>`` per pull that served messages (or failed), covering a held pull's wait too;
pulls that found nothing new make no span.

Tiered messages (store/tier): a read that stops at a record held only in object storage is
answered after the record's chunk is fetched off the loop (``_serve_cold``); the consumer sees
only the latency."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from data_plane.broker.consumer_filter import resolve_predicate
from data_plane.remoting.codes import (
    PERM_READ,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    ResponseCode,
)
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.headers import field_int, field_str
from data_plane.store.message import record_starts, tags_hash_code
from data_plane.store.queue_read import RecordFilter
from data_plane.store.status import GetMessageResult, GetMessageStatus
from data_plane.store.tier.object_store import ObjectStoreError

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.telemetry import Telemetry

log = logging.getLogger(__name__)

MAX_TAGS = 1024
# Fetches one pull of tiered messages waits for at most (each brings a chunk and reads ahead).
COLD_READ_TRIES = 4


def _settle(answer: asyncio.Future[RemotingCommand], task: asyncio.Future[RemotingCommand]) -> None:
    if answer.done():
        return
    if task.cancelled():
        answer.cancel()
    elif (e := task.exception()) is not None:
        answer.set_exception(e)
    else:
        answer.set_result(task.result())


def parse_tag_expression(expression: str | None) -> frozenset[int] | None:
    """Tag hash codes of ``"TagA || TagB"``; None for every tag (``*`` or empty)."""
    if expression is None:
        return None
    expression = expression.strip()
    if not expression or expression == "*":
        return None
    tags = [t.strip() for t in expression.split("||")]
    tags = [t for t in tags if t]  # "||" alone names no tag: it matches nothing, as in RocketMQ
    if len(tags) > MAX_TAGS:
        raise ValueError(f"a subscription names more than {MAX_TAGS} tags")
    return frozenset(tags_hash_code(t) for t in tags)


_NOT_FOUND = {GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_FOUND_NULL}
_RETRY = {GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING}
_MOVED = {GetMessageStatus.OFFSET_OVERFLOW_BADLY, GetMessageStatus.OFFSET_TOO_SMALL}
_EMPTY = {GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE}
# A held pull's state, kept by the hold service for _wake: the answer's future, the connection,
# the request, topic, queue id, offset, max messages, tag hash codes, SQL92 record filter.
_HeldPull = tuple[
    "asyncio.Future[RemotingCommand]", Connection, RemotingCommand, str, int, int, int,
    "frozenset[int] | None", "RecordFilter | None",
]  # fmt: skip


class PullProcessor:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.hold = broker.hold
        self.config = broker.config
        self._wake_held = self._wake  # one bound method for every held pull, not one each

    def pull(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        group = field_str(ext, "consumerGroup", max_length=1024)
        topic = field_str(ext, "topic", max_length=1024)
        queue_id = field_int(ext, "queueId", lo=0, hi=2**31 - 1)
        offset = field_int(ext, "queueOffset", lo=0)
        max_nums = field_int(ext, "maxMsgNums", 32, lo=1, hi=2**31 - 1)
        sys_flag = field_int(ext, "sysFlag", 0, lo=0, hi=2**31 - 1)
        suspend_ms = field_int(ext, "suspendTimeoutMillis", 0, lo=0, hi=2**31 - 1)
        broker = self.broker
        tc = broker.topics.get(topic)
        if tc is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc["perm"] & PERM_READ:
            return cmd.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id >= tc["readQueueNums"]:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{tc['readQueueNums']}]",
            )
        if broker.tenancy is not None:
            throttled = broker.tenancy.before_pull(cmd, topic)
            if throttled is not None:
                return throttled
        g = broker.groups.find(group)
        if g is not None and not g.get("consumeEnable", True):
            return cmd.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        expression_type = (ext or {}).get("expressionType", "TAG") or "TAG"
        if expression_type.upper() != "TAG":  # SQL92: data_plane/broker/consumer_filter.py
            pred = resolve_predicate(broker, cmd, group, topic, sys_flag, expression_type)
            if isinstance(pred, RemotingCommand):
                return pred
            return self._serve(
                conn, cmd, topic, group, queue_id, offset, max_nums, sys_flag, suspend_ms, None, pred.matches_record
            )
        if sys_flag & PULL_FLAG_SUBSCRIPTION:
            expression: str | None = (ext or {}).get("subscription", "*")
        else:
            sd = broker.clients.subscription(group, topic)
            expression = sd.get("subString") if sd else None
        try:
            codes = parse_tag_expression(expression)
        except ValueError as e:
            return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
        return self._serve(conn, cmd, topic, group, queue_id, offset, max_nums, sys_flag, suspend_ms, codes, None)

    def _serve(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        topic: str,
        group: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        sys_flag: int,
        suspend_ms: int,
        codes: frozenset[int] | None,
        record_filter: RecordFilter | None,
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        """Commit the offset the pull carries, read, and answer — or hold the pull until a
        message arrives (a SQL92 pull, ``codes`` None, is woken by any arrival and re-read)."""
        broker = self.broker
        max_nums = min(max_nums, self.config.max_pull_messages)
        # A slave takes commits too (a master that is away; replication.py sends them back).
        if sys_flag & PULL_FLAG_COMMIT_OFFSET:
            commit = field_int(cmd.ext_fields, "commitOffset", -1)
            if commit >= 0:
                broker.offsets.commit(group, topic, queue_id, commit)
        result = self.store.get_message(
            topic, queue_id, offset, max_nums, tags_codes=codes, record_filter=record_filter, coalesce=True
        )
        if result.cold and not result.messages:  # tiered, not in memory: fetch, read again
            read = functools.partial(
                self.store.get_message, topic, queue_id, offset, max_nums, tags_codes=codes,
                record_filter=record_filter, coalesce=True,
            )  # fmt: skip
            return self._serve_cold(cmd, result, read, offset, topic)
        nothing = result.status in _NOT_FOUND or (result.status in _EMPTY and offset == 0)
        if nothing and sys_flag & PULL_FLAG_SUSPEND:
            hold_ms = min(suspend_ms, self.config.max_suspend_ms)
            if not self.config.long_polling_enable:
                hold_ms = min(hold_ms, self.config.short_polling_ms)
            if hold_ms > 0:
                # Held: answered through a future (no task), by _wake, read again then
                answer: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
                payload = (answer, conn, cmd, topic, queue_id, offset, max_nums, codes, record_filter)
                if self.hold.hold(topic, queue_id, offset, hold_ms / 1000, codes, self._wake_held, payload, owner=conn):
                    conn.park()  # a wait, not work: apart from the connection's in-flight cap
                    return answer
        return self._answer(cmd, result, offset, topic)

    async def _serve_cold(
        self,
        cmd: RemotingCommand,
        result: GetMessageResult,
        read: Callable[[], GetMessageResult],
        offset: int,
        topic: str,
    ) -> RemotingCommand:
        """A pull of tiered messages: fetch what the read stopped at (a ranged GET, with read-ahead
        behind it) and read again, until messages come (a cache that cannot keep up is bounded:
        ``COLD_READ_TRIES``)."""
        for _ in range(COLD_READ_TRIES):
            try:
                await self.store.fetch_cold_read(result)
            except ObjectStoreError as e:
                log.warning("a pull of tiered messages of %s failed: %s", topic, e)
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"tiered messages cannot be read now: {e}")
            result = read()
            if not result.cold or result.messages:
                break
        return self._answer(cmd, result, offset, topic)

    def _wake(self, payload: _HeldPull, woken: bool) -> None:
        """A held pull's wait is over (a message came, its time ran out, or its connection
        closed): read again and answer."""
        answer, conn, cmd, topic, queue_id, offset, max_nums, codes, record_filter = payload
        conn.unpark()
        if answer.done():  # cancelled: the broker is stopping
            return
        if conn.closed:
            # The consumer went away while its pull was held (the broker lets go of its pulls
            # when it sees the close): read nothing for it, so that no delivery is counted,
            # metered or traced for messages nobody receives.
            closed = "the connection closed while the pull was held"
            answer.set_result(cmd.response(ResponseCode.PULL_NOT_FOUND, closed))
            return
        try:
            result = self.store.get_message(
                topic, queue_id, offset, max_nums, tags_codes=codes, record_filter=record_filter, coalesce=True
            )
            if result.cold and not result.messages:
                read = functools.partial(
                    self.store.get_message, topic, queue_id, offset, max_nums, tags_codes=codes,
                    record_filter=record_filter, coalesce=True,
                )  # fmt: skip
                task = asyncio.ensure_future(self._serve_cold(cmd, result, read, offset, topic))
                task.add_done_callback(functools.partial(_settle, answer))
                return
            answer.set_result(self._answer(cmd, result, offset, topic))
        except Exception as e:  # the connection answers SYSTEM_ERROR with it, as for any handler
            answer.set_exception(e)

    def _answer(self, cmd: RemotingCommand, result: GetMessageResult, offset: int, topic: str) -> RemotingCommand:
        status = result.status
        ext = {
            "nextBeginOffset": str(result.next_begin_offset),
            "minOffset": str(result.min_offset),
            "maxOffset": str(result.max_offset),
            "suggestWhichBrokerId": self.broker.replication.suggest_broker_id(result.suggest_pulling_from_slave),
        }
        if status is GetMessageStatus.FOUND:
            self.broker.on_pulled(topic, result.message_count, result.buffer_total_size)
            return cmd.response(ResponseCode.SUCCESS, "FOUND", ext, body=result.messages)
        if status in _RETRY:
            return cmd.response(ResponseCode.PULL_RETRY_IMMEDIATELY, status.value, ext)
        if status in _MOVED or (status in _EMPTY and offset != 0):
            return cmd.response(ResponseCode.PULL_OFFSET_MOVED, status.value, ext)
        return cmd.response(ResponseCode.PULL_NOT_FOUND, status.value, ext)


# --- telemetry (registered only when it is on) ---------------------------------------------------
PullHandler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand]"]
# Answers that served nothing and are no failure: a consumer's idle long polls make no span.
_UNTRACED_CODES = frozenset(
    {ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED}
)


def records_in(body: list[memoryview]) -> int:
    """How many records a FOUND answer's body holds (its slices are runs of records)."""
    return sum(1 for _ in record_starts(body))


def traced_pull(handler: PullHandler, tel: Telemetry) -> PullHandler:
    """``handler`` (the pull processor's) followed by a SERVER span ``receive <topic>`` from the
    request's arrival to its answer, made only for pulls that served messages or failed. A pull
    starts a trace of its own (the request carries no trace context)."""
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    from data_plane import telemetry as t

    tracer = tel.tracer

    def record(
        conn: Connection,
        cmd: RemotingCommand,
        start_ns: int,
        answer: RemotingCommand | None,
        error: BaseException | None,
    ) -> None:
        code = answer.code if answer is not None else -1
        if error is None and code in _UNTRACED_CODES:
            return
        ext = cmd.ext_fields or {}
        topic, group = ext.get("topic") or "", ext.get("consumerGroup")
        name, attrs = t.messaging_attributes(topic, t.OP_RECEIVE, consumer_group=group)
        queue_id = ext.get("queueId", "")
        if queue_id.isdigit():
            attrs[t.ATTR_PARTITION] = queue_id
        if conn.peer:
            attrs["client.address"] = conn.peer.rpartition(":")[0]
        if answer is not None and code == ResponseCode.SUCCESS and isinstance(answer.body, list):
            attrs[t.ATTR_BATCH_COUNT] = records_in(answer.body)
        span = tracer.start_span(
            f"{t.OP_RECEIVE} {name}", Context(), SpanKind.SERVER, attributes=attrs, start_time=start_ns
        )
        if error is not None:
            t.end_span_with_exception(span, error)
        else:
            t.end_request_span(span, code, _code_name(code), failed=code != ResponseCode.SUCCESS)

    async def later(
        pending: Awaitable[RemotingCommand], conn: Connection, cmd: RemotingCommand, start_ns: int
    ) -> RemotingCommand:
        try:
            answer = await pending
        except BaseException as e:
            record(conn, cmd, start_ns, None, e)
            raise
        record(conn, cmd, start_ns, answer, None)
        return answer

    def traced(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        start_ns = time.time_ns()
        try:
            answer = handler(conn, cmd)
        except BaseException as e:
            record(conn, cmd, start_ns, None, e)
            raise
        if isinstance(answer, RemotingCommand):
            record(conn, cmd, start_ns, answer, None)
            return answer
        return later(answer, conn, cmd, start_ns)

    return traced


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)
