"""Transactional messages: half messages, END_TRANSACTION (37) and the op log (RocketMQ 4.3+).

::

    producer                                  broker
    SEND (TRAN_MSG=true, PGROUP=g) ─────────▶ half message: RMQ_SYS_TRANS_HALF_TOPIC queue 0, an ordinary
                                              record (sys flag NOT_TYPE) carrying REAL_TOPIC / REAL_QID;
                                              no consumer subscribes to the half topic: invisible
    local transaction runs
    END_TRANSACTION commit (8) ─────────────▶ ① the real message: the half record re-put to REAL_TOPIC /
                                                 REAL_QID, sys flag COMMIT, TRAN_MSG and PGROUP kept,
                                                 TRAN_PREPARED_QUEUE_OFFSET = the transaction's origin
                                              ② the op message: RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0,
                                                 body = the half's queue offset (decimal), tag "d"
    END_TRANSACTION rollback (12) ──────────▶ ② only
    END_TRANSACTION unknown (0) ────────────▶ nothing (the check service asks later)

A half message that stays unresolved is asked about by ``transaction_check.TransactionCheckService``,
which re-puts it with TRANSACTION_CHECK_TIMES + 1 before every CHECK_TRANSACTION_STATE (39). All
copies of one transaction carry TRAN_PREPARED_QUEUE_OFFSET = the queue offset of the first half
record (the transaction's *origin*); the first record has none and is its own origin.

Crash windows (kill -9; the page cache survives it, so a record whose ``pwrite`` returned is kept):

* before ①: nothing changed; the half is unresolved and is checked after the restart; the
  producer's checker answers commit and ① ② happen then.
* between ① and ② (the two appends run back to back in one loop turn, microseconds apart): the
  real message exists but no op names its half. After the restart the half is unresolved, so
  before re-putting anything for a half stored before this process began (its origin's CommitLog
  offset < ``boot_log_end``) the broker looks the real topic's index up by UNIQ_KEY: a COMMIT
  record whose TRAN_PREPARED_QUEUE_OFFSET is the origin means ① happened; only ② is written.
  The same lookup guards END_TRANSACTION and the check service, so a commit is stored once.
* after ②: resolved; a repeated END_TRANSACTION (the producer's own answer racing a check's,
  or a resend) finds the origin resolved and answers SUCCESS without writing anything.
* a rollback's single write (②) is atomic; before it the half is simply checked again.
* a check's re-put copy written but the check progress not yet persisted: after the restart the
  old copy is read again and checked too. Both copies share the origin, so at most one commit
  is stored (the second finds the first through the origin table or the index lookup).

Messages without UNIQ_KEY (no stock client sends one without) cannot be looked up: for them the
window between ① and ② can deliver a commit twice — at least once, as documented.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from data_plane.auth.request_access import PUBLISH
from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.headers import field_bool, field_int, field_str
from data_plane.store.message import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    StoredMessage,
    pack_host,
    tags_hash_code,
)
from data_plane.store.status import PutMessageResult, PutMessageStatus

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.store import MessageStore

log = logging.getLogger(__name__)

# RocketMQ's names (TopicValidator, MixAll, MessageConst, TransactionalMessageUtil).
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CID_RMQ_SYS_TRANS = "CID_RMQ_SYS_TRANS"  # the system group whose offsets are the check progress
REMOVE_TAG = "d"  # an op message's tag: the half it names is resolved
HALF_QUEUE_ID = 0
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"

# Properties of a half copy that the real message does not carry.
_HALF_ONLY = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_CHECK_TIMES)
_LOOKUP_MAX = 32  # index hits read when looking for an already stored commit

# Who may end a transaction (tenancy): (the request, the half's real topic) → allowed?
StoredTopicCheck = Callable[[RemotingCommand, str], bool]


def is_transactional(sys_flag: int, properties: dict[str, str]) -> bool:
    """A send to store as a half message (RocketMQ reads TRAN_MSG; clients also set the flag)."""
    return (sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_NOT_TYPE or (
        properties.get(PROPERTY_TRANSACTION_PREPARED) == "true"
    )


def to_half(msg: Message, producer_group: str) -> None:
    """Turn a send's message into its half message, in place: half topic, queue 0, the real
    topic and queue in properties, sys flag NOT_TYPE (an ordinary record in the half queue)."""
    props = msg.properties
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    if not props.get(PROPERTY_PRODUCER_GROUP):
        props[PROPERTY_PRODUCER_GROUP] = producer_group
    msg.topic = RMQ_SYS_TRANS_HALF_TOPIC
    msg.queue_id = HALF_QUEUE_ID
    msg.sys_flag = msg.sys_flag & ~TRANSACTION_TYPE_MASK


def origin_of(half: StoredMessage) -> int:
    """The half queue offset of the transaction's first half record."""
    raw = half.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
    if raw is not None and raw.isdigit():
        return int(raw)
    return half.queue_offset


def check_times_of(half: StoredMessage) -> int:
    raw = half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0")
    return int(raw) if raw.isdigit() else 0


def real_message(half: StoredMessage, origin: int) -> Message:
    """The committed message: the half's body and properties on its real topic and queue."""
    props = {k: v for k, v in half.properties.items() if k not in _HALF_ONLY}
    props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(origin)
    real_qid = half.properties.get(PROPERTY_REAL_QUEUE_ID, "0")
    return Message(
        half.properties[PROPERTY_REAL_TOPIC],
        half.body,
        int(real_qid) if real_qid.isdigit() else 0,
        half.flag,
        props,
        (half.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE,
        half.born_timestamp,
        pack_host(*half.born_host),
        half.reconsume_times,
        half.commit_log_offset,
    )


def half_copy(half: StoredMessage, origin: int, check_times: int) -> Message:
    """The half re-put before a check: the same message with its check count."""
    props = dict(half.properties)
    props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(check_times)
    props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(origin)
    return Message(
        RMQ_SYS_TRANS_HALF_TOPIC,
        half.body,
        HALF_QUEUE_ID,
        half.flag,
        props,
        half.sys_flag & ~TRANSACTION_TYPE_MASK,
        half.born_timestamp,
        pack_host(*half.born_host),
        half.reconsume_times,
    )


def op_message(half_queue_offset: int, now_ms: int) -> Message:
    return Message(
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        str(half_queue_offset).encode(),
        HALF_QUEUE_ID,
        0,
        {PROPERTY_TAGS: REMOVE_TAG, PROPERTY_WAIT_STORE_MSG_OK: "true"},
        0,
        now_ms,
    )


class TransactionState:
    """What is resolved, shared by END_TRANSACTION and the check service.

    ``removed``: half queue offsets an op names (kept while the check progress is below them);
    ``resolved``: origins resolved by this process or seen in the op log since the progress
    (origin → when, so old entries can go); ``boot_log_end``: the CommitLog's end when this
    process started — a half below it may have lost its op in a crash (see the module doc)."""

    __slots__ = ("boot_log_end", "on_op", "removed", "resolved", "stats")

    def __init__(self, boot_log_end: int) -> None:
        self.boot_log_end = boot_log_end
        self.removed: set[int] = set()
        self.resolved: dict[int, int] = {}
        self.on_op: Callable[[int, int], None] | None = None  # (op queue offset, half queue offset)
        self.stats = {"half": 0, "commit": 0, "rollback": 0, "repaired": 0, "repeated_end": 0}


class TransactionalMessageService:
    """Half messages in, END_TRANSACTION (37) and the op writes. Runs on the broker's loop."""

    def __init__(
        self,
        store: MessageStore,
        *,
        hold_notify: Callable[[str, int, int, int], None] | None = None,
        on_stored: Callable[[str, int, int], None] | None = None,
        stored_topic_check: StoredTopicCheck | None = None,
        is_master: bool = True,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.store = store
        self.state = TransactionState(store.max_phy_offset())
        self.hold_notify = hold_notify
        self.on_stored = on_stored
        self.stored_topic_check = stored_topic_check
        self.is_master = is_master
        self.clock_ms = clock_ms

    @classmethod
    def for_broker(cls, broker: Broker) -> TransactionalMessageService:
        tenancy = broker.tenancy
        check: StoredTopicCheck | None = None
        if tenancy is not None and tenancy.enabled:
            allows = tenancy.allows_stored_topic

            def check(cmd: RemotingCommand, topic: str) -> bool:
                return allows(cmd, topic, PUBLISH)

        return cls(
            broker.store,
            hold_notify=broker.hold.notify,
            on_stored=broker.on_stored,
            stored_topic_check=check,
            is_master=broker.is_master,
        )

    # --- the send path ------------------------------------------------------------------------
    def prepare(self, msgs: list[Message], ext: dict[str, str]) -> str | None:
        """Called by the send path for a transactional send, after its checks and quota: the
        message becomes its half message. A reason to refuse (MESSAGE_ILLEGAL), or None."""
        if len(msgs) != 1:
            return "a batch cannot hold transactional messages"
        if not is_transactional(msgs[0].sys_flag, msgs[0].properties):
            return None  # TRAN_MSG=false: an ordinary message
        to_half(msgs[0], ext.get("a") or ext.get("producerGroup") or "")
        if not msgs[0].properties[PROPERTY_PRODUCER_GROUP]:
            return "a transactional message needs its producer group (PGROUP)"
        self.state.stats["half"] += 1
        return None

    # --- END_TRANSACTION ------------------------------------------------------------------------
    def end_transaction(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand] | None:
        ext = cmd.ext_fields or {}
        group = field_str(ext, "producerGroup", max_length=1024)
        table_offset = field_int(ext, "tranStateTableOffset", lo=0)
        log_offset = field_int(ext, "commitLogOffset", lo=0)
        kind = field_int(ext, "commitOrRollback", lo=0, hi=2**31 - 1)
        from_check = field_bool(ext, "fromTransactionCheck", False)
        if not self.is_master:
            return cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE, "a slave does not end transactions")
        if kind == TRANSACTION_NOT_TYPE:
            # RocketMQ answers nothing: the producer does not know yet, the check service asks later.
            log.debug("transaction %s still unknown (from check: %s)", ext.get("transactionId"), from_check)
            return None if cmd.is_oneway else cmd.response(ResponseCode.SUCCESS)
        if kind not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"commitOrRollback {kind} is not 0, 8 or 12")
        half = self.store.look_message_by_offset(log_offset)
        if (
            half is None
            or half.topic != RMQ_SYS_TRANS_HALF_TOPIC
            or PROPERTY_REAL_TOPIC not in half.properties
            # tenancy: publish on the half's real topic (a refusal looks like "not found")
            or (
                self.stored_topic_check is not None
                and not self.stored_topic_check(cmd, half.properties[PROPERTY_REAL_TOPIC])
            )
        ):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "find prepared transaction message failed")
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != group:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "the producer group wrong")
        if half.queue_offset != table_offset:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "the transaction state table offset wrong")
        if kind == TRANSACTION_ROLLBACK_TYPE:
            return self.resolve(cmd, half, commit=False)
        return self.resolve(cmd, half, commit=True)

    def resolve(
        self, cmd: RemotingCommand | None, half: StoredMessage, *, commit: bool
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        """Commit (① real message, ② op) or roll back (② op) ``half``, at most once per
        transaction. ``cmd`` None: the check service's own resolution (a rollback after the
        last check, an op repaired after a crash); the answer is then only logged."""
        st = self.state
        origin = origin_of(half)
        qoff = half.queue_offset
        if qoff in st.removed or origin in st.resolved:
            # Resolved already (a resend, or a check's answer racing the producer's own): make sure
            # this copy has its op too, then answer as the first time.
            st.stats["repeated_end"] += 1
            if qoff not in st.removed:
                return self._write_op(cmd, qoff, origin, None)
            return _ok(cmd)
        real_result: PutMessageResult | None = None
        if commit:
            if self.committed_already(half, origin):
                st.stats["repaired"] += 1
                log.info("transaction %s (half %d) was committed before a crash; writing its op", origin, qoff)
            else:
                real = real_message(half, origin)
                real_result, _end = self.store.entry.append([real])
                a = real_result.append
                if a is None:
                    return _error(cmd, real_result)
                st.stats["commit"] += 1
                tags = real.properties.get(PROPERTY_TAGS)
                if self.hold_notify is not None:
                    self.hold_notify(real.topic, real.queue_id, a.queue_offset + 1, tags_hash_code(tags) if tags else 0)
                if self.on_stored is not None:
                    self.on_stored(real.topic, 1, a.wrote_bytes)
        else:
            st.stats["rollback"] += 1
        return self._write_op(cmd, qoff, origin, real_result)

    def _write_op(
        self, cmd: RemotingCommand | None, qoff: int, origin: int, real_result: PutMessageResult | None
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        st = self.state
        st.resolved[origin] = self.clock_ms()
        op = op_message(qoff, self.clock_ms())
        if self.store.sync_flush:
            return self._write_op_and_wait(cmd, op, qoff)
        result, _end = self.store.entry.append([op])
        return self._op_written(cmd, result, qoff)

    async def _write_op_and_wait(self, cmd: RemotingCommand | None, op: Message, qoff: int) -> RemotingCommand:
        # The op is appended before the first await (right behind the real message); the wait
        # covers both, the op being the later record.
        result = await self.store.put_messages([op])
        return self._op_written(cmd, result, qoff)

    def _op_written(self, cmd: RemotingCommand | None, result: PutMessageResult, qoff: int) -> RemotingCommand:
        a = result.append
        if a is None:
            # The real message (if any) is stored and the origin is marked resolved: the check
            # service writes this op when the half comes due.
            log.warning("op for half %d not written: %s %s", qoff, result.status.value, result.reason)
            return _error(cmd, result)
        st = self.state
        st.removed.add(qoff)
        if st.on_op is not None:
            st.on_op(a.queue_offset, qoff)
        if result.status is not PutMessageStatus.PUT_OK:
            return _error(cmd, result)
        return _ok(cmd)

    def committed_already(self, half: StoredMessage, origin: int) -> bool:
        """Whether the real topic holds this transaction's COMMIT record already. Only a half
        older than this process can have one without an op (the ①-② crash window); the index
        is asked only then."""
        if origin == half.queue_offset:
            first = half.commit_log_offset
        else:  # a check's copy: where its origin was stored (-1 once retention removed it)
            first = self.store.commit_log_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID, origin)
        if first >= self.state.boot_log_end:
            return False  # begun in this process: a commit would have marked it resolved
        uniq = half.properties.get(PROPERTY_UNIQ_KEY)
        real_topic = half.properties.get(PROPERTY_REAL_TOPIC)
        if not uniq or not real_topic:
            return False
        want = str(origin)
        for m in self.store.query_message(real_topic, uniq, _LOOKUP_MAX):
            if (m.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE and m.properties.get(
                PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET
            ) == want:
                return True
        return False


_RESULT_CODES = {
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.DISK_FULL: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.OS_PAGECACHE_BUSY: ResponseCode.SYSTEM_BUSY,
}


def _ok(cmd: RemotingCommand | None) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS) if cmd is not None else RemotingCommand(ResponseCode.SUCCESS)


def _error(cmd: RemotingCommand | None, result: PutMessageResult) -> RemotingCommand:
    code = _RESULT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
    remark = result.reason or result.status.value
    if cmd is None:
        return RemotingCommand(code, remark=remark)
    return cmd.response(code, remark)
