"""TransactionCheckService: asks producers about half messages nobody resolved, and rolls back
those that stay unknown (RocketMQ's TransactionalMessageCheckService).

::

    half queue (RMQ_SYS_TRANS_HALF_TOPIC:0)      progress            cursor
    ──┬─────┬─────┬─────┬─────┬─────┬─────┬────────┼───────┬─────┬─────┼──────────▶
      │ h0  │ h1  │ h2  │ ... resolved or superseded │ pending (unresolved, read) │ not read yet
    op queue (RMQ_SYS_TRANS_OP_HALF_TOPIC:0): body = a resolved half's queue offset, tag "d"

Every ``transaction_check_scan_interval_ms`` the service

1. reads the half queue from its cursor; a half no op names becomes *pending*, due at its store
   time + ``transaction_timeout_ms`` (or its CHECK_IMMUNITY_TIME_IN_SECONDS) for a first record,
   + ``transaction_check_interval_ms`` for a check's copy;
2. handles every pending half that is due, in due order: resolved meanwhile → dropped; its
   transaction committed before a crash (module ``transaction``: the index lookup) → only the op
   is written; checked ``transaction_check_max`` times → rolled back (op only); otherwise the half
   is re-put with TRANSACTION_CHECK_TIMES + 1 (the count lives in the log, so it survives
   restarts) and CHECK_TRANSACTION_STATE (39) about the copy goes, oneway, to one connected
   producer of its group (no producer connected: the check counts anyway, as in RocketMQ);
3. moves the progress to the lowest pending half (or the cursor) and the op progress over ops
   naming halves below it. Both are the consumer offsets of the system group CID_RMQ_SYS_TRANS
   on the two topics (``consumerOffset.json``, saved within a second and at shutdown).

At start ``load()`` reads the op queue from the op progress, so halves resolved before a restart
stay resolved, and the cursor starts at the progress: nothing unresolved is skipped. A crash
after a re-put but before the progress is saved reads the older copy again; both copies then
share their origin (see ``transaction``), so the transaction still ends once.

Memory: one small entry per pending half (at most ``max_pending``; past it the cursor waits)
plus the resolved half offsets above the progress, which lags the newest half by at most a
check interval.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from data_plane.broker.transaction import (
    CID_RMQ_SYS_TRANS,
    HALF_QUEUE_ID,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TransactionalMessageService,
    check_times_of,
    half_copy,
    origin_of,
)
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import (
    MESSAGE_MAGIC_CODE,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    PROPS_LEN,
    RECORD_HEADER,
    TOPIC_LEN,
    RecordError,
    StoredMessage,
    decode_record,
    encode_properties,
    pack_host,
)
from data_plane.store.status import GetMessageStatus

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.broker.consumer_offset import ConsumerOffsetManager

log = logging.getLogger(__name__)

READ_BATCH = 256
MAX_PENDING = 200_000

# (producer group, request) → whether a producer connection took it.
SendCheck = Callable[[str, RemotingCommand], bool]


class Pending:
    """An unresolved half record the service has read."""

    __slots__ = ("check_times", "commit_log_offset", "due_ms", "origin", "queue_offset")

    def __init__(self, queue_offset: int, commit_log_offset: int, origin: int, check_times: int, due_ms: int) -> None:
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.origin = origin
        self.check_times = check_times
        self.due_ms = due_ms


def _skip_to(status: GetMessageStatus, offset: int, next_begin: int) -> int | None:
    """Where a scan goes on after a read that found nothing (None: the queue's end)."""
    if status is GetMessageStatus.OFFSET_TOO_SMALL:
        return next_begin  # retention removed the start: go on from the queue's first unit
    if status in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
        return max(offset + 1, next_begin)
    return None


def check_request(copy: StoredMessage) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE about a half copy: the header names it; the body is the message as
    a CommitLog record on its real topic and queue (RocketMQ's MessageDecoder.encode)."""
    uniq = copy.properties.get(PROPERTY_UNIQ_KEY, "")
    ext = {
        "tranStateTableOffset": str(copy.queue_offset),
        "commitLogOffset": str(copy.commit_log_offset),
        "msgId": uniq,
        "transactionId": uniq,
        "offsetMsgId": copy.msg_id,
    }
    qid = copy.properties.get(PROPERTY_REAL_QUEUE_ID, "0")
    body = encode_record(copy, copy.properties.get(PROPERTY_REAL_TOPIC, copy.topic), int(qid) if qid.isdigit() else 0)
    return RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, ext_fields=ext, body=body)


def encode_record(m: StoredMessage, topic: str, queue_id: int) -> bytes:
    """``m`` in the CommitLog record layout (data_plane.store.message), with another topic and queue."""
    topic_b = topic.encode()
    props = encode_properties(m.properties)
    total = RECORD_HEADER.size + len(m.body) + 1 + len(topic_b) + 2 + len(props)
    head = RECORD_HEADER.pack(
        total, MESSAGE_MAGIC_CODE, m.body_crc, queue_id, m.flag, m.queue_offset, m.commit_log_offset, m.sys_flag,
        m.born_timestamp, pack_host(*m.born_host), m.store_timestamp, pack_host(*m.store_host), m.reconsume_times,
        m.prepared_transaction_offset, len(m.body),
    )  # fmt: skip
    return b"".join((head, m.body, TOPIC_LEN.pack(len(topic_b)), topic_b, PROPS_LEN.pack(len(props)), props))


class TransactionCheckService:
    def __init__(
        self,
        service: TransactionalMessageService,
        offsets: ConsumerOffsetManager,
        *,
        send_check: SendCheck,
        timeout_ms: int = 6_000,
        check_interval_ms: int = 30_000,
        check_max: int = 15,
        scan_interval_ms: int = 1_000,
        max_pending: int = MAX_PENDING,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.service = service
        self.store = service.store
        self.state = service.state
        self.offsets = offsets
        self.send_check = send_check
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.check_max = check_max
        self.scan_interval_ms = scan_interval_ms
        self.max_pending = max_pending
        self.clock_ms = clock_ms
        # Resolved origins are remembered this long: past it every copy has been rolled back.
        self.resolved_keep_ms = timeout_ms + (check_max + 2) * check_interval_ms
        self.progress = 0
        self.op_progress = 0
        self.cursor = 0
        self.pending: dict[int, Pending] = {}
        self._due: list[tuple[int, int]] = []  # (due ms, half queue offset), lazily cleaned
        self._removed_heap: list[int] = []
        self._ops: deque[tuple[int, int]] = deque()  # (op queue offset, half queue offset) past op progress
        self._tasks: set[asyncio.Future[RemotingCommand]] = set()
        self.stats = {"checks": 0, "checks_unsent": 0, "rolled_back": 0, "copies": 0}
        self.state.on_op = self._on_op

    @classmethod
    def for_broker(cls, broker: Broker, service: TransactionalMessageService) -> TransactionCheckService:
        cfg = broker.config
        clients = broker.clients

        def send_check(group: str, cmd: RemotingCommand) -> bool:
            conn = clients.producer_connection(group)
            if conn is None:
                return False
            conn.invoke_oneway(cmd)
            return True

        return cls(
            service,
            broker.offsets,
            send_check=send_check,
            timeout_ms=cfg.transaction_timeout_ms,
            check_interval_ms=cfg.transaction_check_interval_ms,
            check_max=cfg.transaction_check_max,
            scan_interval_ms=cfg.transaction_check_scan_interval_ms,
        )

    # --- start ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Progress from the system group's offsets; resolved halves from the op queue."""
        store = self.store
        half_min = store.min_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        progress = self.offsets.query(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        self.progress = self.cursor = max(progress, half_min)
        op_min = store.min_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
        op_progress = self.offsets.query(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
        self.op_progress = max(op_progress, op_min)
        now = self.clock_ms()
        n = 0
        for op_qoff, half_qoff in self._read_ops(self.op_progress):
            n += 1
            self._ops.append((op_qoff, half_qoff))
            if half_qoff >= self.progress:
                self._mark_removed(half_qoff)
                half = self._half_at(half_qoff)
                if half is not None:
                    self.state.resolved[origin_of(half)] = now
        log.info(
            "transactions: check progress %d, op progress %d, %d ops read, %d halves resolved above the progress",
            self.progress, self.op_progress, n, len(self.state.removed),
        )  # fmt: skip

    def _read_ops(self, start: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        offset = start
        while True:
            r = self.store.get_message(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID, offset, READ_BATCH)
            if r.status is not GetMessageStatus.FOUND:
                skip_to = _skip_to(r.status, offset, r.next_begin_offset)
                if skip_to is None:
                    return out
                offset = skip_to
                continue
            for raw, op_qoff in zip(r.messages, r.queue_offsets, strict=True):
                try:
                    body = decode_record(raw).body
                    out.append((op_qoff, int(body)))
                except (RecordError, ValueError):
                    log.warning("op message at %d is unreadable; ignored", op_qoff)
            offset = r.next_begin_offset

    def _half_at(self, queue_offset: int) -> StoredMessage | None:
        phy = self.store.commit_log_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID, queue_offset)
        return self.store.look_message_by_offset(phy) if phy >= 0 else None

    def _mark_removed(self, half_qoff: int) -> None:
        if half_qoff not in self.state.removed:
            self.state.removed.add(half_qoff)
            heapq.heappush(self._removed_heap, half_qoff)

    def _on_op(self, op_qoff: int, half_qoff: int) -> None:
        self._ops.append((op_qoff, half_qoff))
        heapq.heappush(self._removed_heap, half_qoff)  # state.removed has it already
        self.pending.pop(half_qoff, None)

    # --- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval_ms / 1000)
            try:
                self.tick()
            except Exception:
                log.exception("transaction check round failed")

    def tick(self) -> None:
        now = self.clock_ms()
        self._read_new(now)
        self._handle_due(now)
        self._advance(now)

    def _read_new(self, now: int) -> None:
        store = self.store
        while len(self.pending) < self.max_pending:
            r = store.get_message(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID, self.cursor, READ_BATCH)
            if r.status is not GetMessageStatus.FOUND:
                skip_to = _skip_to(r.status, self.cursor, r.next_begin_offset)
                if skip_to is None:
                    return
                self.cursor = skip_to
                continue
            for raw, qoff in zip(r.messages, r.queue_offsets, strict=True):
                self.cursor = qoff + 1
                if qoff in self.state.removed:
                    continue
                try:
                    half = decode_record(raw)
                except RecordError as e:
                    log.error("half message at queue offset %d is unreadable (%s); skipped", qoff, e)
                    continue
                self._add_pending(half)
                if len(self.pending) >= self.max_pending:
                    return

    def _add_pending(self, half: StoredMessage) -> None:
        times = check_times_of(half)
        if times == 0:
            wait = self.timeout_ms
            immunity = half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "")
            if immunity.isdigit():
                wait = max(wait, int(immunity) * 1000)
        else:
            wait = self.check_interval_ms
        p = Pending(half.queue_offset, half.commit_log_offset, origin_of(half), times, half.store_timestamp + wait)
        self.pending[p.queue_offset] = p
        heapq.heappush(self._due, (p.due_ms, p.queue_offset))

    def _handle_due(self, now: int) -> None:
        due = self._due
        while due and due[0][0] <= now:
            _, qoff = heapq.heappop(due)
            p = self.pending.get(qoff)
            if p is None or p.due_ms > now:
                continue
            if qoff in self.state.removed:
                del self.pending[qoff]
                continue
            half = self.store.look_message_by_offset(p.commit_log_offset)
            if half is None:  # removed by retention: nothing left to check
                log.warning("half message at queue offset %d is gone (retention); dropped", qoff)
                del self.pending[qoff]
                continue
            self._handle(p, half, now)

    def _handle(self, p: Pending, half: StoredMessage, now: int) -> None:
        svc = self.service
        if p.origin in self.state.resolved:
            self._spawn(svc.resolve(None, half, commit=False))  # another copy ended it: op only
        elif svc.committed_already(half, p.origin):
            self._spawn(svc.resolve(None, half, commit=True))  # committed before a crash: op only
        elif p.check_times >= self.check_max:
            log.warning(
                "transaction %s of group %s unresolved after %d checks: rolled back",
                half.properties.get(PROPERTY_UNIQ_KEY, p.origin), half.properties.get(PROPERTY_PRODUCER_GROUP),
                p.check_times,
            )  # fmt: skip
            self.stats["rolled_back"] += 1
            self._spawn(svc.resolve(None, half, commit=False))
        else:
            self._check(p, half, now)
            return
        self.pending.pop(p.queue_offset, None)

    def _check(self, p: Pending, half: StoredMessage, now: int) -> None:
        result, _end = self.store.entry.append([half_copy(half, p.origin, p.check_times + 1)])
        a = result.append
        if a is None:  # not stored (disk full...): try again next round
            p.due_ms = now + self.scan_interval_ms
            heapq.heappush(self._due, (p.due_ms, p.queue_offset))
            log.warning("re-putting half %d for its check failed: %s", p.queue_offset, result.reason)
            return
        del self.pending[p.queue_offset]  # superseded by the copy (which the cursor reads next)
        self.stats["copies"] += 1
        copy = self.store.look_message_by_offset(a.wrote_offset)
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        if copy is None:
            return
        if self.send_check(group, check_request(copy)):
            self.stats["checks"] += 1
        else:
            self.stats["checks_unsent"] += 1
            log.info("no producer of group %s is connected to check half %d", group, copy.queue_offset)

    def _spawn(self, r: RemotingCommand | Awaitable[RemotingCommand]) -> None:
        if isinstance(r, RemotingCommand):
            return
        fut = asyncio.ensure_future(r)
        self._tasks.add(fut)
        fut.add_done_callback(self._tasks.discard)

    def _advance(self, now: int) -> None:
        st = self.state
        progress = min(self.pending) if self.pending else self.cursor
        self.progress = max(self.progress, progress)
        heap = self._removed_heap
        while heap and heap[0] < self.progress:
            st.removed.discard(heapq.heappop(heap))
        ops = self._ops
        while ops and ops[0][1] < self.progress:
            self.op_progress = ops.popleft()[0] + 1
        if not ops:
            self.op_progress = max(
                self.op_progress, self.store.max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
            )
        resolved = st.resolved
        horizon = now - self.resolved_keep_ms
        while resolved:
            origin, at = next(iter(resolved.items()))
            if at > horizon:
                break
            del resolved[origin]
        self.offsets.commit(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID, self.progress)
        self.offsets.commit(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID, self.op_progress)
