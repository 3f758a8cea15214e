"""MessageTrace: a message's life kept by the broker — stored, delivered (to which group, client
and address), consumed, retried, dead-lettered — queryable by message id (RocketMQ's msg-trace
idea, recorded on the broker instead of by the clients).

    send ─▶ SendProcessor._answer ─▶ on_stored ─┐
    pull answer (SUCCESS) ─▶ wrap_pull ─▶ on_delivered ─┤   buffer (≤ trace_buffer_max events;
    offset commit past a delivered message ─▶ on_offset_advance ─┤   full: dropped and counted)
    CONSUMER_SEND_MSG_BACK ─▶ record(msg_id, "retried" | "dead_lettered", …) ─┘
                                                  │ every trace_flush_interval_ms, or trace_batch_max events
                                                  ▼
                      MessageStore.append(batch) into topic ORBIT_SYS_TRACE, queue 0
                      one message per event; KEYS = "<UNIQ_KEY> <offset msg id>" → the IndexFile

    QUERY_MESSAGE_TRACE (9002) {topic, msgId} ─▶ query(): the message (by offset id or UNIQ_KEY)
        + the trace topic's events for every id it has ─▶ {"events": [...]} oldest first

Hot-path cost: the send, pull and commit hooks append one tuple to a list (and, for a pull,
unpack two integers per record); ids are resolved, JSON built and the store written on the
flush, which runs on the event loop between requests in batches. The trace topic has no topic
config: it is never routed, pulled or written by clients, and the store's retention ages it
out with the CommitLog.

Event body (JSON)::

    {"event": "delivered", "time": 1700000000000, "topic": "T", "queueId": 0, "queueOffset": 7,
     "msgId": "<offset msg id>", "uniqKey": "<client msg id>", "group": "G",
     "clientId": "…", "clientAddr": "127.0.0.1:5555"}

``stored`` adds producerGroup, bornHost, bornTimestamp, storeTimestamp; ``consumed`` has the group
and the client the message was delivered to. Other helpers add events with
``broker.trace.record(msg_id, event, **fields)`` (see ``record``).

What a kill -9 loses: events still in the buffer (at most one flush interval, ~100 ms of
events). Events already appended are in the page cache and survive a process crash. ``stored``
never depends on the buffer: the query rebuilds it from the message's own record when its event
is missing. The links "delivered → consumed" are kept in memory (``_unconsumed``), so a commit
after a restart of offsets delivered before it records no ``consumed`` event; the messages
redelivered after the restart (offsets not yet committed) are traced again.

On a slave nothing is recorded (its CommitLog must stay a byte copy of the master's); queries
work on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import orjson

from data_plane.filter.sql92 import record_properties
from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import HeaderError
from data_plane.remoting.headers import field_str
from data_plane.store.message import (
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    TOTAL_SIZE,
    Message,
    StoredMessage,
    decode_message_id,
    encode_message_id,
    record_starts,
    unpack_host,
)
from data_plane.store.tier.object_store import ObjectStoreError
from data_plane.tenancy.namespace import DLQ_PREFIX, RETRY_PREFIX, tenant_of

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker
    from data_plane.store import MessageStore
    from data_plane.store.status import AppendResult

log = logging.getLogger(__name__)

TRACE_TOPIC: Final = "ORBIT_SYS_TRACE"
STORED: Final = "stored"
DELIVERED: Final = "delivered"
CONSUMED: Final = "consumed"
RETRIED: Final = "retried"
DEAD_LETTERED: Final = "dead_lettered"
EVENTS: Final = (STORED, DELIVERED, CONSUMED, RETRIED, DEAD_LETTERED)

MAX_UNCONSUMED_PER_QUEUE: Final = 8192  # delivered, not yet committed, per (group, topic, queue)
MAX_UNCONSUMED_QUEUES: Final = 65_536
MAX_QUERY_EVENTS: Final = 256

_QOFF_PHY = struct.Struct(">qq")  # queue offset, physical offset: bytes 20..36 of a record
_QOFF_AT = 20
_STORE_HOST_AT = 64

PullHandler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand]"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageTrace:
    def __init__(
        self,
        store: MessageStore,
        *,
        flush_interval_ms: int = 100,
        batch_max: int = 256,
        buffer_max: int = 65_536,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.store = store
        self.flush_interval_s = max(flush_interval_ms, 1) / 1000
        self.batch_max = max(batch_max, 1)
        self.buffer_max = buffer_max
        self.clock_ms = clock_ms
        self._buffer: list[tuple[Any, ...]] = []
        self._pending = 0  # events in the buffer (a stored batch or a pull answer is several)
        self._unconsumed: dict[tuple[str, str, int], dict[int, tuple[int, str]]] = {}
        self._flush_soon: asyncio.Handle | None = None
        self.written = 0
        self.dropped = 0

    # --- hot path: one tuple per call ----------------------------------------------------------
    def _add(self, item: tuple[Any, ...], n: int) -> None:
        if self._pending + n > self.buffer_max:
            self.dropped += n
            return
        self._buffer.append(item)
        self._pending += n
        if self._pending >= self.batch_max and self._flush_soon is None:
            with contextlib.suppress(RuntimeError):  # no running loop (tools, tests): next flush
                self._flush_soon = asyncio.get_running_loop().call_soon(self._flush_now)

    def on_stored(self, cmd: RemotingCommand, msgs: list[Message], topic: str, queue_id: int, a: AppendResult) -> None:
        ext = cmd.ext_fields or {}
        group = ext.get("a") or ext.get("producerGroup") or ""
        item = (STORED, self.clock_ms(), topic, queue_id, a.queue_offset, a.wrote_offset, a.msg_num, group,
                msgs[0].born_host, msgs[0].born_timestamp, a.store_timestamp)  # fmt: skip
        self._add(item, a.msg_num)

    def on_delivered(self, conn: Connection, cmd: RemotingCommand, runs: list[memoryview]) -> None:
        ext = cmd.ext_fields or {}
        group = ext.get("consumerGroup", "")
        topic = ext.get("topic", "")
        try:
            queue_id = int(ext.get("queueId", "0"))
        except ValueError:
            return
        client = str(conn.attrs.get("client_id") or "")
        unpack = _QOFF_PHY.unpack_from
        pairs = [unpack(run, at + _QOFF_AT) for run, at in record_starts(runs)]
        self._add((DELIVERED, self.clock_ms(), group, topic, queue_id, pairs, client, conn.peer), len(pairs))
        key = (group, topic, queue_id)
        waiting = self._unconsumed.get(key)
        if waiting is None:
            if len(self._unconsumed) >= MAX_UNCONSUMED_QUEUES:
                return
            waiting = self._unconsumed[key] = {}
        for qoff, phy in pairs:
            if len(waiting) >= MAX_UNCONSUMED_PER_QUEUE:
                del waiting[next(iter(waiting))]
            waiting[phy] = (qoff, client)

    def on_offset_advance(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A commit moved (group, topic, queue)'s offset: what was delivered below it is consumed."""
        key = (group, topic, queue_id)
        waiting = self._unconsumed.get(key)
        if not waiting:
            return
        done = [(phy, q, c) for phy, (q, c) in waiting.items() if q < offset]
        if not done:
            return
        for phy, _q, _c in done:
            del waiting[phy]
        if not waiting:
            del self._unconsumed[key]
        self._add((CONSUMED, self.clock_ms(), group, topic, queue_id, done), len(done))

    def record(self, msg_id: str, event: str, **fields: Any) -> None:
        """Add an event of another feature to a message's trace (on the broker's event loop).

        ``msg_id``: the offset message id of the stored message (what CONSUMER_SEND_MSG_BACK
        carries as ``offset``: ``encode_message_id(store_host, offset)``) or its UNIQ_KEY.
        ``event``: ``"retried"`` or ``"dead_lettered"`` (any short name is kept). ``fields``:
        JSON-able values, by convention ``group``, ``topic`` (the message's topic as the consumer
        saw it), ``retryTopic`` / ``dlqTopic``, ``reconsumeTimes``, ``delayLevel``, ``clientAddr``.
        For ``retried`` / ``dead_lettered`` with a ``group``, the delivery is not later reported
        as ``consumed`` by that group. Never blocks; dropped and counted when the buffer is full."""
        group = fields.get("group")
        if event in (RETRIED, DEAD_LETTERED) and isinstance(group, str):
            phy = _offset_of(msg_id)
            if phy is not None:
                for key in [k for k in self._unconsumed if k[0] == group]:
                    waiting = self._unconsumed[key]
                    waiting.pop(phy, None)
                    if not waiting:
                        del self._unconsumed[key]
        self._add(("custom", self.clock_ms(), msg_id, event, fields), 1)

    def wrap_pull(self, handler: PullHandler) -> PullHandler:
        """``handler`` followed by ``on_delivered`` for answers that carry messages."""

        async def later(pending: Awaitable[RemotingCommand], conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            answer = await pending
            if answer.code == ResponseCode.SUCCESS and isinstance(answer.body, list):
                self.on_delivered(conn, cmd, answer.body)
            return answer

        def traced(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
            answer = handler(conn, cmd)
            if isinstance(answer, RemotingCommand):
                if answer.code == ResponseCode.SUCCESS and isinstance(answer.body, list):
                    self.on_delivered(conn, cmd, answer.body)
                return answer
            return later(answer, conn, cmd)

        return traced

    # --- the flush: ids, JSON and one store append per batch ------------------------------------
    async def run(self) -> None:
        """Flush every flush interval until cancelled."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                self.flush()
            except Exception:
                log.exception("writing message trace events failed")

    def _flush_now(self) -> None:
        self._flush_soon = None
        try:
            self.flush()
        except Exception:
            log.exception("writing message trace events failed")

    def flush(self) -> int:
        """Write every buffered event; the number written."""
        if not self._buffer:
            return 0
        items, self._buffer, self._pending = self._buffer, [], 0
        ids: dict[int, tuple[str, str]] = {}
        host = self.store.commit_log.store_host
        out: list[Message] = []
        for item in items:
            for event in self._events(item, ids, host):
                out.append(self._message(event, host))
        wrote = 0
        for i in range(0, len(out), self.batch_max):
            batch = out[i : i + self.batch_max]
            result, end = self.store.entry.append(batch)
            if end < 0:
                self.dropped += len(batch)
                log.warning("message trace batch not stored: %s", result.reason or result.status.value)
            else:
                wrote += len(batch)
        self.written += wrote
        return wrote

    def _ids(self, phy: int, ids: dict[int, tuple[str, str]], host: bytes) -> tuple[str, str]:
        """(offset msg id, UNIQ_KEY or "") of the record at ``phy``."""
        got = ids.get(phy)
        if got is None:
            rec = self.store.read_record(phy)
            props = record_properties(rec) if rec is not None else None
            # The id names the host that stored it (the record's), not this process's port.
            stored_by = bytes(rec[_STORE_HOST_AT : _STORE_HOST_AT + 8]) if rec is not None and len(rec) > 72 else host
            got = ids[phy] = (encode_message_id(stored_by, phy), (props or {}).get(PROPERTY_UNIQ_KEY, ""))
        return got

    def _events(self, item: tuple[Any, ...], ids: dict[int, tuple[str, str]], host: bytes) -> list[dict[str, Any]]:
        kind, t = item[0], item[1]
        if kind == STORED:
            _k, _t, topic, queue_id, qoff, phy, n, group, born_host, born_ts, store_ts = item
            try:
                ip, port = unpack_host(born_host)
                born = f"{ip}:{port}"
            except (ValueError, OSError, struct.error):
                born = ""
            events = []
            for i in range(n):
                rec = self.store.read_record(phy)
                if rec is None:
                    break
                size = TOTAL_SIZE.unpack_from(rec, 0)[0]
                msg_id, uniq = self._ids(phy, ids, host)
                events.append({
                    "event": STORED, "time": t, "topic": topic, "queueId": queue_id, "queueOffset": qoff + i,
                    "msgId": msg_id, "uniqKey": uniq, "producerGroup": group, "bornHost": born,
                    "bornTimestamp": born_ts, "storeTimestamp": store_ts,
                })  # fmt: skip
                phy += size
            return events
        if kind == DELIVERED:
            _k, _t, group, topic, queue_id, pairs, client, addr = item
            return [
                {"event": DELIVERED, "time": t, "topic": topic, "queueId": queue_id, "queueOffset": qoff,
                 "msgId": (ids_ := self._ids(phy, ids, host))[0], "uniqKey": ids_[1], "group": group,
                 "clientId": client, "clientAddr": addr}
                for qoff, phy in pairs
            ]  # fmt: skip
        if kind == CONSUMED:
            _k, _t, group, topic, queue_id, done = item
            return [
                {"event": CONSUMED, "time": t, "topic": topic, "queueId": queue_id, "queueOffset": qoff,
                 "msgId": (ids_ := self._ids(phy, ids, host))[0], "uniqKey": ids_[1], "group": group,
                 "clientId": client}
                for phy, qoff, client in done
            ]  # fmt: skip
        _k, _t, msg_id, event, fields = item
        body: dict[str, Any] = {"event": str(event), "time": t}
        body.update({str(k): v for k, v in fields.items()})
        phy = _offset_of(msg_id)
        if phy is not None and self.store.read_record(phy) is not None:
            body["msgId"], body["uniqKey"] = self._ids(phy, ids, host)
        else:
            body["msgId"], body["uniqKey"] = str(msg_id), str(msg_id)
        return [body]

    def _message(self, event: dict[str, Any], host: bytes) -> Message:
        keys = " ".join(dict.fromkeys(k for k in (event.get("uniqKey"), event.get("msgId")) if k))
        try:
            body = orjson.dumps(event)
        except TypeError:  # a caller's field that is not JSON: keep its text
            body = orjson.dumps({k: v if isinstance(v, str | int | float | bool | None) else str(v)
                                 for k, v in event.items()})  # fmt: skip
        return Message(TRACE_TOPIC, body, 0, 0, {PROPERTY_KEYS: keys}, 0, int(event.get("time") or 0), host)


def _offset_of(msg_id: str) -> int | None:
    try:
        return decode_message_id(msg_id)[2]
    except (ValueError, OSError):
        return None


# --- query ---------------------------------------------------------------------------------------
def _visible(event_topic: str, topic: str) -> bool:
    """Events of the traced topic, and of retry / dead-letter topics in its namespace."""
    if event_topic == topic:
        return True
    return event_topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) and tenant_of(event_topic) == tenant_of(topic)


def _stored_from_record(m: StoredMessage) -> dict[str, Any]:
    return {
        "event": STORED, "time": m.store_timestamp, "topic": m.topic, "queueId": m.queue_id,
        "queueOffset": m.queue_offset, "msgId": m.msg_id, "uniqKey": m.properties.get(PROPERTY_UNIQ_KEY, ""),
        "bornHost": f"{m.born_host[0]}:{m.born_host[1]}", "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp,
        "source": "record",
    }  # fmt: skip


def query(store: MessageStore, topic: str, msg_id: str, max_events: int = MAX_QUERY_EVENTS) -> list[dict[str, Any]]:
    """The trace of the message ``msg_id`` (an offset msg id or UNIQ_KEY) of ``topic``, oldest first."""
    phy = _offset_of(msg_id)
    by_offset = store.look_message_by_offset(phy) if phy is not None else None
    found = _found(topic, msg_id, by_offset, store.query_message(topic, msg_id, 16))
    keys = _keys(msg_id, found)
    traces = [t for key in sorted(keys) for t in store.query_message(TRACE_TOPIC, key, max_events)]
    return _timeline(topic, found, keys, traces, max_events)


async def query_tiered(
    store: MessageStore, topic: str, msg_id: str, max_events: int = MAX_QUERY_EVENTS
) -> list[dict[str, Any]]:
    """``query`` where the message or its events may be only in the tier: each record is fetched
    and decoded in turn (raises ObjectStoreError)."""
    phy = _offset_of(msg_id)
    by_offset = await store.look_message_by_offset_cold(phy) if phy is not None else None
    found = _found(topic, msg_id, by_offset, await store.query_message_cold(topic, msg_id, 16))
    keys = _keys(msg_id, found)
    traces = [t for key in sorted(keys) for t in await store.query_message_cold(TRACE_TOPIC, key, max_events)]
    return _timeline(topic, found, keys, traces, max_events)


def _found(
    topic: str, msg_id: str, by_offset: StoredMessage | None, by_key: list[StoredMessage]
) -> dict[int, StoredMessage]:
    """The message itself: the record an offset msg id names, and those whose UNIQ_KEY it is."""
    found: dict[int, StoredMessage] = {}
    m = by_offset
    if m is not None and m.topic == topic and m.msg_id == msg_id.upper():
        found[m.commit_log_offset] = m
    for m in by_key:
        if m.properties.get(PROPERTY_UNIQ_KEY) == msg_id:
            found[m.commit_log_offset] = m
    return found


def _keys(msg_id: str, found: dict[int, StoredMessage]) -> set[str]:
    keys = {msg_id}
    for m in found.values():
        keys.add(m.msg_id)
        if m.properties.get(PROPERTY_UNIQ_KEY):
            keys.add(m.properties[PROPERTY_UNIQ_KEY])
    return keys


def _timeline(
    topic: str, found: dict[int, StoredMessage], keys: set[str], traces: list[StoredMessage], max_events: int
) -> list[dict[str, Any]]:
    events: dict[int, dict[str, Any]] = {}
    for t in traces:
        if t.commit_log_offset in events:
            continue
        try:
            e = orjson.loads(t.body)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(e, dict) or not _visible(str(e.get("topic") or topic), topic):
            continue
        if e.get("msgId") not in keys and e.get("uniqKey") not in keys:
            continue
        events[t.commit_log_offset] = e
    out = list(events.values())
    have_stored = {e.get("msgId") for e in out if e.get("event") == STORED}
    for m in found.values():
        if m.msg_id not in have_stored:  # its event was lost (crash, trace off): the record says it
            out.append(_stored_from_record(m))
    order = {name: i for i, name in enumerate(EVENTS)}
    out.sort(key=lambda e: (int(e.get("time") or 0), order.get(str(e.get("event")), len(order))))
    return out[:max_events]


def query_handler(
    broker: Broker,
) -> Callable[[Connection, RemotingCommand], RemotingCommand | Awaitable[RemotingCommand]]:
    """QUERY_MESSAGE_TRACE (9002): ext ``topic``, ``msgId`` → body ``{"events": [...]}``."""

    async def tiered(cmd: RemotingCommand, topic: str, msg_id: str) -> RemotingCommand:
        try:
            events = await query_tiered(broker.store, topic, msg_id)
        except ObjectStoreError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"tiered messages cannot be read now: {e}")
        return answer(cmd, topic, msg_id, events)

    def answer(cmd: RemotingCommand, topic: str, msg_id: str, events: list[dict[str, Any]]) -> RemotingCommand:
        if not events:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"no message {msg_id} in topic {topic} on this broker")
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps({"events": events}))

    def handle(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        topic = field_str(ext, "topic", max_length=1024)
        msg_id = field_str(ext, "msgId", max_length=128)
        if not msg_id.strip():
            raise HeaderError("header field 'msgId' is empty")
        trace = broker.trace
        if trace is not None:
            trace.flush()  # what is buffered is part of the answer
        if broker.store.tier is not None:  # the message, or its events, may be only in the tier
            return tiered(cmd, topic, msg_id)
        return answer(cmd, topic, msg_id, query(broker.store, topic, msg_id))

    return handle


def install(broker: Broker) -> MessageTrace | None:
    """The broker's MessageTrace when ``trace_enabled`` and it is a master (None otherwise);
    hooks the offset manager. The caller wraps the pull handler and runs ``run()``."""
    cfg = broker.config
    if not cfg.trace_enabled or not cfg.is_master:
        return None
    trace = MessageTrace(
        broker.store,
        flush_interval_ms=cfg.trace_flush_interval_ms,
        batch_max=cfg.trace_batch_max,
        buffer_max=cfg.trace_buffer_max,
    )
    broker.offsets.on_advance = trace.on_offset_advance
    return trace
