"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

V2 carries the same header as SEND_MESSAGE under one-letter names (a=producerGroup b=topic
c=defaultTopic d=defaultTopicQueueNums e=queueId f=sysFlag g=bornTimestamp h=flag i=properties
j=reconsumeTimes k=unitMode l=maxReconsumeTimes m=batch). Under ASYNC_FLUSH a send is answered
in the same loop turn as its append; under SYNC_FLUSH once the group commit covers it.

A send takes one of four routes. Three are fast routes for *plain* messages (properties the
store writes back as they came, no transaction, schedule or re-put marker); they store without
store Message objects and share one gate, ``_plain_topic`` (its guards named there: the broker
takes writes, no message trace, answered at append — ASYNC_FLUSH and not a SYNC_MASTER —, a
writable topic that is not a system topic). Whatever a fast route does not take goes on to the
next, and the last, ``_send_messages``, is the reference, which stores anything or gives the
error:

    send_frame          a single SEND_MESSAGE_V2 read off its frame (Connection.frame_handler);
                        not a topic a tenant's quota meters; answered with the whole frame
                        (``put_plain``: the same for a RocketMQ 5 client's single message)
    _send_plain         a single SEND_MESSAGE_V2 from its command; takes the quota when metered
    _send_plain_batch   a SEND_BATCH_MESSAGE whose body is plain, laid out from its bytes
    _send_messages      every send, as store Messages (the reference)

With telemetry on, the broker registers ``traced_send(handler, ...)`` instead of the handler: a
SERVER span ``send <topic>`` per request (the child of the producer's span its message carries)
and the send-latency histogram. Off, the handlers run as they are."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, cast

from data_plane.broker.batch_decode import batch_messages
from data_plane.broker.config import BrokerRole
from data_plane.broker.schedule import SYSTEM_TOPICS, TRIGGER_PROPERTIES
from data_plane.broker.transaction import PROPERTY_PRODUCER_GROUP, RMQ_SYS_TRANS_HALF_TOPIC
from data_plane.remoting.bodies import BATCH_ITEM_HEAD, MAX_BATCH_MESSAGES, TopicConfig
from data_plane.remoting.codes import FLAG_RESPONSE, PERM_WRITE, RequestCode, ResponseCode
from data_plane.remoting.command import (
    BODY_TYPES,
    BODY_VIEW_BYTES,
    SERIALIZE_JSON,
    Body,
    RemotingCommand,
)
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import HeaderError
from data_plane.remoting.headers import field_int, field_str
from data_plane.remoting.send_frame import SEND_OK_HEADER, send_fields, send_ok_frame
from data_plane.store import fastpath
from data_plane.store.message import (
    FLAG_BORNHOST_V6,
    FLAG_STOREHOST_V6,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_TYPE_MASK,
    Message,
    decode_properties,
    pack_host,
    properties_of,
    tags_hash_code,
)
from data_plane.store.status import APPENDED, PutMessageResult, PutMessageStatus

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.broker.tenancy import BrokerTenancy
    from data_plane.store._speedups import Appended
    from data_plane.telemetry import BrokerMetrics, Telemetry

V2_NAMES_TO_V1 = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
}

_V2_LETTERS = {v: k for k, v in V2_NAMES_TO_V1.items()}
_V2_FIELD = re.compile(r"'([a-m])'")

SYNC_MASTER = BrokerRole.SYNC_MASTER

# A batch whose messages carry none of these is laid out from its body as it is (plain batches,
# data_plane/store/fastpath.py): the broker acts on them — schedule.py moves delayed and timed
# messages and drops a client's re-put marker; TRAN_MSG makes a half message.
PLAIN_BATCH_SKIP = tuple(sorted(name.encode() for name in (*TRIGGER_PROPERTIES, PROPERTY_TRANSACTION_PREPARED)))


class _NotPlain(Enum):
    """``_send_plain`` did not store the message; whether it took the publish quota for it."""

    QUOTA_FREE = 0
    QUOTA_TAKEN = 1


_STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.DISK_FULL: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.OS_PAGECACHE_BUSY: ResponseCode.SYSTEM_BUSY,
    PutMessageStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
}


class _HeaderNames(NamedTuple):
    """Where each field of a send's header is: SEND_MESSAGE spells names out, V2 uses letters."""

    topic: str
    default_topic: str
    default_topic_queue_nums: str
    queue_id: str
    sys_flag: str
    born_timestamp: str
    flag: str
    properties: str
    reconsume_times: str
    batch: str


V1_NAMES = _HeaderNames(
    "topic",
    "defaultTopic",
    "defaultTopicQueueNums",
    "queueId",
    "sysFlag",
    "bornTimestamp",
    "flag",
    "properties",
    "reconsumeTimes",
    "batch",
)
V2_NAMES = _HeaderNames(*(_V2_LETTERS[n] for n in V1_NAMES))


def _born_host(conn: Connection) -> bytes:
    h = conn.attrs.get("born_host")
    if h is None:
        ip, _, port = conn.peer.rpartition(":")
        try:
            h = pack_host(ip, int(port))
        except (ValueError, OSError):
            h = pack_host("127.0.0.1", 0)
        conn.attrs["born_host"] = h
    return h


class SendProcessor:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.topics = broker.topics
        self.hold = broker.hold
        self.sync_flush = broker.store.sync_flush
        self.store_host_hex = broker.store.commit_log.store_host.hex().upper().encode()
        self.max_message_bytes = broker.store.config.max_message_size_bytes
        # A batch's body (every message with its framing) is held to a message's limit too (4 MiB,
        # RocketMQ's maxMessageSize): docs/filters_and_trace.md#batches.
        self.max_batch_bytes = broker.store.config.max_message_size_bytes
        self._metered: dict[str, bool] = {}  # topic -> whether a tenant's quota counts its sends

    def _meters(self, tenancy: BrokerTenancy, topic: str) -> bool:
        """``tenancy.meters(topic)``, remembered: it depends on the name alone."""
        if len(self._metered) >= 65536:
            self._metered.clear()
        metered = self._metered[topic] = tenancy.meters(topic)
        return metered

    def send_v2(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields or {}
        quota_taken = False
        if ext.get("m") != "true":
            plain = self._send_plain(conn, cmd, ext)
            if not isinstance(plain, _NotPlain):
                return plain
            quota_taken = plain is _NotPlain.QUOTA_TAKEN
        try:
            return self._send_messages(conn, cmd, ext, V2_NAMES, quota_taken)
        except HeaderError as e:  # say which field a letter stands for
            raise HeaderError(_V2_FIELD.sub(lambda m: f"'{m[1]}' ('{V2_NAMES_TO_V1[m[1]]}')", str(e))) from None

    def send_v1(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        return self._send_messages(conn, cmd, cmd.ext_fields or {}, V1_NAMES)

    def _send_plain(self, conn: Connection, cmd: RemotingCommand, ext: dict[str, str]) -> RemotingCommand | _NotPlain:
        """The common single SEND_MESSAGE_V2 — ASYNC_FLUSH, an ASYNC_MASTER, no message trace, a
        plain message (``MessageStore.append_plain``) to a writable topic's queue that is not a
        system topic's, every header number well formed — stored from its header's properties
        text and its body, with no Message object and no properties dict. A ``_NotPlain`` when any
        of that does not hold: ``_send``, the reference path, stores it or gives the error,
        without taking the publish quota again when this took it (only ever for a plain
        message: no transaction's half, whose producer group the quota's hook checks)."""
        topic = ext.get("b")
        if type(topic) is not str:
            return _NotPlain.QUOTA_FREE
        try:  # the reference path's defaults, and int() as field_int parses
            queue_id = int(ext["e"])
            sys_flag = int(ext.get("f") or 0)
            born_ts = int(ext.get("g") or 0)
            flag = int(ext.get("h") or 0)
            reconsume = int(ext.get("j") or 0)
        except (KeyError, ValueError, TypeError):
            return _NotPlain.QUOTA_FREE
        body = cmd.body
        if not isinstance(body, BODY_TYPES):
            return _NotPlain.QUOTA_FREE
        put = self._put_plain(conn, cmd, topic, queue_id, sys_flag, born_ts, flag, reconsume, ext.get("i") or "", body)
        if put.__class__ is not APPENDED:
            if put.__class__ is PutMessageResult:  # refused (an I/O error)
                return self._answer(cmd, put, None, topic, queue_id)
            return cast("RemotingCommand | _NotPlain", put)
        raw = cast("Appended", put)  # (the class check above: no isinstance on the hot path)
        if cmd.serialize_type != SERIALIZE_JSON:  # a binary header: the general answer
            return self._answer(
                cmd, self.store.stored_result(raw), None, topic, queue_id, (cast("int", raw.tags_code),)
            )
        self._stored_plain(topic, queue_id, raw)
        # (Not in _stored_plain: send_frame never stores a message a tenant's quota meters.)
        if (tenancy := self.broker.tenancy) is not None:
            tenancy.after_put(topic, 1)
        return self._stored_answer(cmd, raw.wrote_offset, queue_id, raw.queue_offset)

    def send_frame(self, conn: Connection, frame: Body) -> bytes | None:
        """A plain single send answered straight from its frame (``Connection.frame_handler``):
        its fields read off the bytes (``send_fields``), stored as ``_send_plain`` stores them,
        and the answer's whole frame returned — no command object, extFields dict or handler
        table on the way. None, with nothing stored, for any frame that is not such a send, or
        whose message the plain path does not take, or whose topic's sends a tenant's quota
        meters, or that the store refused: the command path then handles it as before."""
        f = send_fields(frame, BODY_VIEW_BYTES)
        if f is None:
            return None
        opaque, version, topic, queue_id, sys_flag, born_ts, flag, reconsume, props, body = f
        put = self._put_plain(conn, None, topic, queue_id, sys_flag, born_ts, flag, reconsume, props, body)
        if put.__class__ is not APPENDED:
            # Not plain (nothing stored or taken), or the CommitLog file refused the bytes
            # (nothing recorded): the command path answers — the store refuses it again (a full
            # disk marks the store) or, after a passing I/O error, writes it.
            return None
        raw = cast("Appended", put)  # (the class check above: no isinstance on the hot path)
        self._stored_plain(topic, queue_id, raw)
        return send_ok_frame(version, opaque, self.store_host_hex, raw.wrote_offset, queue_id, raw.queue_offset)

    def put_plain(
        self, conn: Connection, topic: str, queue_id: int, born_ts: int, props: str | bytes, body: Body
    ) -> int | None:
        """A RocketMQ 5 client's plain message (``data_plane.proxy``), stored as ``send_frame``
        stores a remoting one: its queue offset; or None, with nothing stored, when it is not
        plain, its topic's sends a tenant's quota meters, or the store refused it: the caller
        then takes the command path, which stores it or gives the error."""
        put = self._put_plain(conn, None, topic, queue_id, 0, born_ts, 0, 0, props, body)
        if put.__class__ is not APPENDED:
            return None
        raw = cast("Appended", put)  # (the class check above)
        self._stored_plain(topic, queue_id, raw)
        return raw.queue_offset

    def put_plain_batch(self, conn: Connection, topic: str, queue_id: int, born_ts: int, body: bytes) -> int | None:
        """A RocketMQ 5 client's plain messages of one topic, already a SEND_BATCH_MESSAGE body
        (``data_plane.proxy.v2_codec``), stored as ``_send_plain_batch`` stores a remoting
        batch: the first message's queue offset; or None, with nothing stored, when the topic or
        queue does not take plain sends, a tenant's quota meters the topic, or the body is not plain
        or not stored: the caller then takes the command path, which stores it or gives the error."""
        tc = self._plain_topic(topic)
        if tc is None or not 0 <= queue_id < tc["writeQueueNums"] or len(body) > self.max_batch_bytes:
            return None
        broker = self.broker
        tenancy = broker.tenancy
        if broker.before_put is not None:
            if broker.before_put_plain is None or tenancy is None:
                return None
            metered = self._metered.get(topic)
            if metered is None:
                metered = self._meters(tenancy, topic)
            if metered:  # the quota takes its tokens with the request's command
                return None
        put = self.store.append_plain_batch(
            body, topic, queue_id, sys_flag=0, born_timestamp=born_ts, born_host=_born_host(conn),
            reconsume_times=0, max_messages=MAX_BATCH_MESSAGES, skip_names=PLAIN_BATCH_SKIP,
        )  # fmt: skip
        if put is None:
            return None
        result, _end, tag_codes = put
        a = result.append
        if a is None:
            return None  # (nothing written: the command path gives its error)
        broker.replication.notify()
        if self.hold.held:
            end = a.queue_offset + a.msg_num
            for tag_code in tag_codes:
                self.hold.notify(topic, queue_id, end, tag_code)
        broker.on_stored(topic, a.msg_num, a.wrote_bytes)
        if tenancy is not None:
            tenancy.after_put(topic, a.msg_num)
        return a.queue_offset

    def _put_plain(
        self, conn: Connection, cmd: RemotingCommand | None, topic: str, queue_id: int, sys_flag: int,
        born_ts: int, flag: int, reconsume: int, props: str | bytes, body: Body,
    ) -> Appended | PutMessageResult | RemotingCommand | _NotPlain:  # fmt: skip
        """The plain append of ``_send_plain`` and ``send_frame``: what the append wrote
        (``MessageStore.append_plain``'s ``Appended``), its refusal (an I/O error), the quota's refusal, or
        ``_NotPlain`` with nothing stored. A topic the quota meters is only taken with the
        request's command (``cmd``), which the quota's hook reads."""
        tc = self._plain_topic(topic)
        if tc is None:
            return _NotPlain.QUOTA_FREE
        broker = self.broker
        sys_flag &= ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)
        # The message's own guards (the reference route gives each its error):
        queue_exists = 0 <= queue_id < tc["writeQueueNums"]  # (no random queue: -1 goes there)
        not_a_half = not sys_flag & TRANSACTION_TYPE_MASK  # a transaction's half is prepared there
        numbers_in_range = sys_flag >= 0 and reconsume >= 0
        body_fits = 0 < len(body) <= self.max_message_bytes
        if not (queue_exists and not_a_half and numbers_in_range and body_fits):
            return _NotPlain.QUOTA_FREE
        not_plain = _NotPlain.QUOTA_FREE
        if broker.before_put is not None:
            tenancy = broker.tenancy
            if broker.before_put_plain is None or tenancy is None:
                return not_plain
            metered = self._metered.get(topic)
            if metered is None:
                metered = self._meters(tenancy, topic)
            if metered:
                # Plain (so not a transaction's half, whose producer group before_put checks)
                # before the token is taken: the reference path may then store it without.
                if cmd is None or not fastpath.plain_properties(props, PLAIN_BATCH_SKIP):
                    return not_plain
                refused = broker.before_put_plain(cmd, topic, 1, len(body))
                if refused is not None:
                    return refused
                not_plain = _NotPlain.QUOTA_TAKEN
        born_host = conn.attrs.get("born_host") or _born_host(conn)
        put = self.store.entry.append_plain(
            topic, queue_id, body, props, flag, sys_flag, born_ts, born_host, reconsume, PLAIN_BATCH_SKIP
        )
        if put is None:
            return not_plain
        service = broker.replication.service
        if service is not None:  # (replication.notify(), without its call)
            service.notify()
        return put

    def _stored_plain(self, topic: str, queue_id: int, raw: Appended) -> None:
        """``_answer``'s work for one plain message stored, from what the append wrote:
        held pulls of its queue woken, the broker's counts."""
        if self.hold.held:
            self.hold.notify(topic, queue_id, raw.queue_offset + 1, raw.tags_code)
        broker = self.broker
        if broker.metrics is None:  # on_stored(topic, 1, wrote_bytes), inline
            stats = broker.stats
            stats["put_msgs"] += 1
            stats["put_bytes"] += raw.wrote_bytes
        else:
            broker.on_stored(topic, 1, raw.wrote_bytes)

    def _plain_topic(self, topic: str) -> TopicConfig | None:
        """The gate of the fast routes: the topic's config when a send to it may be stored
        plain, else None (the next route). Each guard is named for what it keeps out."""
        broker = self.broker
        takes_writes = broker.writable  # (else the reference route says who does)
        untraced = broker.trace is None  # a message trace writes a record per message
        # Answered at append: a SYNC_FLUSH or SYNC_MASTER send waits (``_put_and_wait``).
        # (role: replication.sync_master, without its call)
        answered_at_append = not self.sync_flush and broker.replication.role is not SYNC_MASTER
        if not (takes_writes and untraced and answered_at_append):
            return None
        tc = self.topics.topics.get(topic)
        writable = tc is not None and bool(tc["perm"] & PERM_WRITE)  # (and it exists: no creating)
        tenant_or_user_topic = topic not in SYSTEM_TOPICS  # system topics have their own writers' rules
        return tc if writable and tenant_or_user_topic else None

    def _send_messages(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        ext: dict[str, str],
        names: _HeaderNames,
        quota_taken: bool = False,
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        broker = self.broker
        if not broker.writable:
            what = "fenced: its master lease is not confirmed" if broker.is_master else "a slave"
            remark = f"broker {broker.address} is {what}: send to the master"
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, remark)
        topic = field_str(ext, names.topic, max_length=1024)
        batch = cmd.code == 320 or ext.get(names.batch) == "true"
        tc = self.topics.get(topic)
        if tc is None:
            default_topic = ext.get(names.default_topic) or ""
            queue_nums = field_int(ext, names.default_topic_queue_nums, 4, lo=1, hi=broker.config.max_topic_queue_nums)
            try:
                tc = self.topics.create_in_send(topic, default_topic, queue_nums)
            except ValueError as e:
                return cmd.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            if tc is None:
                return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
            broker.topics_changed()
        if not tc["perm"] & PERM_WRITE:
            return cmd.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending is forbidden")
        queue_id = field_int(ext, names.queue_id, -1, lo=-(2**31), hi=2**31 - 1)
        nq = tc["writeQueueNums"]
        if queue_id < 0:
            queue_id = random.randrange(nq)
        elif queue_id >= nq:
            if not (queue_id < tc["readQueueNums"] and not tc["order"]):
                return cmd.response(ResponseCode.SYSTEM_ERROR, queue_not_writable(topic, queue_id, tc))
            # A read-only queue (being drained) of an unordered topic, on a stale route: the
            # message goes to writable queue id % writeQueueNums (one queue's messages to one
            # queue), and the answer's queueId names it — no error for a client that has not yet
            # refreshed its route, and nothing added to a queue on its way out.
            queue_id %= nq
        # A batch's body is used where it lies (a large one is a view of the frame); a single
        # message's becomes its store Message's bytes.
        raw = cmd.body
        body = raw if batch and isinstance(raw, memoryview) else cmd.body_bytes()
        if not body:
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, "the message body is empty")
        limit = self.max_batch_bytes if batch else self.max_message_bytes
        if len(body) > limit:
            what = "batch" if batch else "message body"
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, f"the {what} is {len(body)} bytes, over {limit}")
        # The broker, not the client, says what the hosts are (IPv4, 8 bytes each): a client's
        # IPv6 host bits would make the record unreadable and cut the log there on recovery.
        sys_flag = field_int(ext, names.sys_flag, 0, lo=0, hi=2**31 - 1) & ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)
        born_ts = field_int(ext, names.born_timestamp, 0)
        reconsume = field_int(ext, names.reconsume_times, 0, lo=0, hi=2**31 - 1)
        born_host = _born_host(conn)
        if batch:
            not_a_half = not sys_flag & TRANSACTION_TYPE_MASK  # a transaction's half: its own path
            quota_counts_plain = broker.before_put is None or broker.before_put_plain is not None
            if not_a_half and quota_counts_plain and self._plain_topic(topic) is not None:
                plain = self._send_plain_batch(cmd, body, topic, queue_id, sys_flag, born_ts, born_host, reconsume)
                if plain is not None:
                    return plain
            msgs = batch_messages(body, topic, queue_id, sys_flag, born_ts, born_host, reconsume)
        else:  # a batch's properties are its messages'; a single message's are in the header
            try:
                props = decode_properties(ext.get(names.properties, ""))
            except ValueError as e:
                raise HeaderError(f"header field 'properties' is malformed: {e}") from None
            flag = field_int(ext, names.flag, 0, lo=-(2**31), hi=2**31 - 1)
            one = cast(bytes, body)  # not a batch: body_bytes() above
            msgs = [Message(topic, one, queue_id, flag, props, sys_flag, born_ts, born_host, reconsume)]
        if broker.before_put is not None and not quota_taken:
            refused = broker.before_put(conn, cmd, msgs)
            if refused is not None:
                return refused
        if sys_flag & TRANSACTION_TYPE_MASK or (not batch and PROPERTY_TRANSACTION_PREPARED in msgs[0].properties):
            why = broker.transactions.prepare(msgs, ext)  # stored as a half message (transaction.py)
            if why is not None:
                return cmd.response(ResponseCode.MESSAGE_ILLEGAL, why)
            if (group := msgs[0].properties.get(PROPERTY_PRODUCER_GROUP)) and msgs[0].topic == RMQ_SYS_TRANS_HALF_TOPIC:
                broker.clients.note_half_sender(conn, group)  # its checks may come back here
        if (why := broker.schedule.redirect(msgs)) is not None:  # DELAY / TIMER_* → the schedule topics
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, why)
        if self.sync_flush or broker.replication.sync_master:
            return self._put_and_wait(cmd, msgs, topic, queue_id)
        result, _end = self.store.entry.append(msgs)
        broker.replication.notify()
        return self._answer(cmd, result, msgs, topic, queue_id)

    def _send_plain_batch(
        self,
        cmd: RemotingCommand,
        body: bytes | memoryview,
        topic: str,
        queue_id: int,
        sys_flag: int,
        born_ts: int,
        born_host: bytes,
        reconsume: int,
    ) -> RemotingCommand | None:
        """A batch whose body is plain, stored from its bytes with no store Messages (ASYNC_FLUSH,
        not a SYNC_MASTER, no message trace). None when the body is not plain: the caller splits
        it into Messages, the reference path, which also gives any error."""
        broker = self.broker
        tenancy = broker.tenancy
        if broker.before_put_plain is not None and tenancy is not None and tenancy.meters(topic):
            # quotas: the batch's count and bytes first (another scan of the body: only for a
            # tenant's topic)
            counted = fastpath.plain_batch(body, MAX_BATCH_MESSAGES, PLAIN_BATCH_SKIP)
            if counted is None:
                return None
            refused = broker.before_put_plain(cmd, topic, counted.msg_count, counted.body_bytes)
            if refused is not None:
                return refused
        # Writing makes the same check (one scan of the body, not two without quotas).
        put = self.store.append_plain_batch(
            body, topic, queue_id, sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
            reconsume_times=reconsume, max_messages=MAX_BATCH_MESSAGES, skip_names=PLAIN_BATCH_SKIP,
        )  # fmt: skip
        if put is None:  # not plain, nothing written
            return None
        result, _end, tag_codes = put
        broker.replication.notify()
        return self._answer(cmd, result, None, topic, queue_id, tag_codes)

    async def _put_and_wait(
        self, cmd: RemotingCommand, msgs: list[Message], topic: str, queue_id: int
    ) -> RemotingCommand:
        """SYNC_FLUSH: answer once the bytes are on disk; SYNC_MASTER: once a slave holds them
        too (FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE otherwise, never a false PUT_OK)."""
        replication = self.broker.replication
        if self.sync_flush:
            result = await self.store.put_messages(msgs)
        else:
            result, _end = self.store.entry.append(msgs)
        if replication.sync_master and result.status is PutMessageStatus.PUT_OK:
            a = result.append
            if a is not None:
                status = await replication.replicated(a.wrote_offset + a.wrote_bytes)
                if status is not PutMessageStatus.PUT_OK:
                    result.status = status
        else:
            replication.notify()
        return self._answer(cmd, result, msgs, topic, queue_id)

    def _stored_answer(
        self, cmd: RemotingCommand, wrote_offset: int, queue_id: int, queue_offset: int
    ) -> RemotingCommand:
        """SUCCESS for one message stored at ``wrote_offset`` (a JSON request's common answer),
        its header formatted directly: the same JSON encode_header writes."""
        out = RemotingCommand(ResponseCode.SUCCESS, opaque=cmd.opaque, flag=FLAG_RESPONSE, version=cmd.version)
        out.raw_header = SEND_OK_HEADER % (
            cmd.version, cmd.opaque, self.store_host_hex, wrote_offset, queue_id, queue_offset,
        )  # fmt: skip
        return out

    def _answer(
        self,
        cmd: RemotingCommand,
        result: PutMessageResult,
        msgs: list[Message] | None,
        topic: str,
        queue_id: int,
        tag_codes: tuple[int, ...] = (),
    ) -> RemotingCommand:
        """The answer to a put of ``msgs`` — or of a plain batch body (``msgs`` None), whose
        distinct tag codes the layout gave."""
        status = result.status
        a = result.append
        if a is None:
            code = _STATUS_CODES.get(status, ResponseCode.SYSTEM_ERROR)
            return cmd.response(code, result.reason or status.value)
        # Stored (perhaps not yet durable): wake held pulls of the queue the records went to,
        # if any wait: a delayed or half message went to a system topic's queue, not to
        # (topic, queue_id), and wakes that queue's pulls when it gets there. Every tag of a
        # batch, not only its last message's: a pull held for the tag of an earlier message
        # must wake too (RocketMQ notifies per dispatched message).
        end = a.queue_offset + a.msg_num
        if not self.hold.held:
            pass
        elif msgs is None:  # a plain batch: stored in (topic, queue_id) itself
            for tag_code in tag_codes:
                self.hold.notify(topic, queue_id, end, tag_code)
        elif len(msgs) == 1:
            m = msgs[0]
            tags = m.properties.get(PROPERTY_TAGS)
            self.hold.notify(m.topic, m.queue_id, end, tags_hash_code(tags) if tags else 0)
        else:  # the batch's distinct tags gathered at C speed (map), then hashed once each
            distinct = set(map(dict.get, map(properties_of, msgs), repeat(PROPERTY_TAGS, len(msgs))))
            for tag_code in {tags_hash_code(t) if t else 0 for t in distinct}:
                self.hold.notify(msgs[0].topic, msgs[0].queue_id, end, tag_code)
        self.broker.on_stored(topic, a.msg_num, a.wrote_bytes)
        if (tenancy := self.broker.tenancy) is not None:
            tenancy.after_put(topic, a.msg_num)
        if self.broker.trace is not None and msgs is not None:  # the "stored" trace event (trace.py)
            self.broker.trace.on_stored(cmd, msgs, topic, queue_id, a)
        if status is PutMessageStatus.PUT_OK and a.msg_num == 1 and cmd.serialize_type == SERIALIZE_JSON:
            return self._stored_answer(cmd, a.wrote_offset, queue_id, a.queue_offset)
        ok = status is PutMessageStatus.PUT_OK  # by identity: an Enum's hash is a Python-level call
        code = ResponseCode.SUCCESS if ok else _STATUS_CODES.get(status, ResponseCode.SYSTEM_ERROR)
        ext = {
            "msgId": a.msg_ids,
            "queueId": str(queue_id),
            "queueOffset": str(a.queue_offset),
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
        return cmd.response(code, None if ok else result.reason or status.value, ext)


# --- telemetry (registered only when it is on) ---------------------------------------------------
SendHandler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand]"]
# Codes of a stored message (perhaps not as durable as asked): not failures.
_STORED_CODES = frozenset(
    {ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
     ResponseCode.SLAVE_NOT_AVAILABLE}
)  # fmt: skip
_TRACEPARENT_BYTES = b"traceparent\x01"


def queue_not_writable(topic: str, queue_id: int, tc: TopicConfig) -> str:
    """The remark of SYSTEM_ERROR for a send to a queue id at or above the topic's
    writeQueueNums: RocketMQ's "request queueId[N] is illegal" (clients that follow routes key on
    it), then whether the queue is read-only (below readQueueNums: it is being drained) or gone."""
    write, read = tc["writeQueueNums"], tc["readQueueNums"]
    state = "read-only" if queue_id < read else "gone"
    return (
        f"request queueId[{queue_id}] is illegal, topic[{topic}] queue {queue_id} is {state}: "
        f"writeQueueNums {write}, readQueueNums {read}; refresh the topic's route"
    )


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


def _batch_properties(cmd: RemotingCommand) -> list[dict[str, str] | None]:
    """Each batch message's properties when they carry a trace context (None otherwise), read
    without copying bodies; what cannot be read is skipped (the handler refuses the batch)."""
    b = cmd.body
    mv = memoryview(b if isinstance(b, BODY_TYPES) else cmd.body_bytes())
    out: list[dict[str, str] | None] = []
    pos, n = 0, len(mv)
    while n - pos >= 22:
        total, _magic, _crc, _flag, body_len = BATCH_ITEM_HEAD.unpack_from(mv, pos)
        if total < 22 or pos + total > n or body_len < 0 or 22 + body_len > total:
            break
        raw = bytes(mv[pos + 22 + body_len : pos + total])
        try:
            out.append(decode_properties(raw) if _TRACEPARENT_BYTES in raw else None)
        except ValueError:
            out.append(None)
        pos += total
    return out


def traced_send(handler: SendHandler, tel: Telemetry, metrics: BrokerMetrics) -> SendHandler:
    """``handler`` (a send processor's) inside a SERVER span ``send <topic>``, recording the
    send latency. The span continues the trace context of the (first) message; a batch's span
    links to each producer span its messages carry."""
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind

    from data_plane import telemetry as t

    tracer = tel.tracer

    def done(span: Span, topic: str, began: float, code: int) -> None:
        metrics.send_latency(None, topic, time.perf_counter() - began)
        t.end_request_span(span, code, _code_name(code), failed=code not in _STORED_CODES)

    async def later(pending: Awaitable[RemotingCommand], span: Span, topic: str, began: float) -> RemotingCommand:
        try:
            answer = await pending
        except BaseException as e:
            t.end_span_with_exception(span, e)
            raise
        done(span, topic, began, answer.code)
        return answer

    def traced(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        began = time.perf_counter()
        start_ns = time.time_ns()
        ext = cmd.ext_fields or {}
        names = V1_NAMES if cmd.code == RequestCode.SEND_MESSAGE else V2_NAMES
        topic = ext.get(names.topic) or ""
        batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or ext.get(names.batch) == "true"
        props: list[dict[str, str] | None]
        if batch:
            props = _batch_properties(cmd)
            name, attrs = t.messaging_attributes(topic, t.OP_SEND)
            attrs[t.ATTR_BATCH_COUNT] = len(props)
        else:
            try:
                one = decode_properties(ext.get(names.properties, ""))
            except ValueError:
                one = {}
            props = [one]
            name, attrs = t.messaging_attributes(topic, t.OP_SEND, message_id=one.get(PROPERTY_UNIQ_KEY))
            attrs[t.ATTR_BODY_SIZE] = len(cmd.body) if isinstance(cmd.body, bytes | bytearray | memoryview) else 0
        queue_id = ext.get(names.queue_id, "")
        if queue_id.isdigit():
            attrs[t.ATTR_PARTITION] = queue_id
        if conn.peer:
            attrs["client.address"] = conn.peer.rpartition(":")[0]
        first = next((p for p in props if p), None)
        parent = t.extract_context(first) if first is not None else Context()
        links = t.producer_links(props) if batch else ()
        span = tracer.start_span(
            f"{t.OP_SEND} {name}", parent, SpanKind.SERVER, attributes=attrs, links=links, start_time=start_ns
        )
        try:
            answer = handler(conn, cmd)
        except BaseException as e:
            t.end_span_with_exception(span, e)
            raise
        if isinstance(answer, RemotingCommand):
            done(span, topic, began, answer.code)
            return answer
        return later(answer, span, topic, began)

    return traced
