"""Lease-based (POP) consumption: what RocketMQ 5 clients receive, acknowledge and hand back.

A consumer group receives messages from a queue under a lease: each message handed out is
invisible to the group's other receivers until its lease ends, then it is handed out again with
its delivery attempt counted, and after the group's last attempt it goes to the group's
dead-letter topic. An acknowledgement ends the lease for good. Every queue a group consumes this
way is a ``PopQueue``:

* ``next``: where the next scan for new messages starts; every offset below it is leased or done;
* ``leases``: offset -> ``Lease`` (deadline, attempt, the handle's random ``seq``);
* ``done``: offsets at or above ``next`` that are finished (acknowledged, filtered out, dead-lettered).

FIFO groups: a message whose message group (``__SHARDINGKEY``) has an earlier message leased or
skipped is not handed out, so a group's next message waits for the previous one's acknowledgement.

Receipt handles are ``<queue id>:<offset>:<seq>``, ``seq`` 64 random bits drawn per lease: a
handle is good only while its lease is the one the book holds, so it cannot be guessed, and a
handle of a lease that was renewed or handed to another receiver is refused as stale.

The new messages a receive takes from a queue share one lease (``Lease`` is immutable): one
deadline, one ``seq`` (the journal still has an entry per offset, the form every version reads).
When the compiled module is built,
``_v2_codec.lease_scan`` takes them straight from the stored records (no FIFO group, a tag
filter or none), and the endpoint writes each answer from its record: no message is decoded
into a Python object on the way.

Durability: every change is a record on the system topic ``rmq_sys_POP_JOURNAL`` (queue 0) in
the CommitLog, so it survives a restart like a message and reaches the slaves with the
CommitLog; acknowledgements are answered only once their record is stored (and, on a
SYNC_MASTER, replicated). Every ``SNAPSHOT_EVERY`` records the whole book is written to queue 1;
recovery (start, promotion) loads the newest snapshot and replays the records after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from data_plane.store.compiled import v2_codec
from data_plane.store.message import PROPERTY_TAGS, Message, StoredMessage, decode_record
from data_plane.store.status import GetMessageStatus, PutMessageStatus
from data_plane.store.tier.object_store import ObjectStoreError

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker

log = logging.getLogger(__name__)

JOURNAL_TOPIC = "rmq_sys_POP_JOURNAL"
JOURNAL_QUEUE = 0
SNAPSHOT_QUEUE = 1
SNAPSHOT_EVERY = 4096
PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"
# Bounds: leases a group may hold on one queue, how far past ``next`` a receive scans, and the
# most a receive hands out.
MAX_LEASES_PER_QUEUE = 65536
SCAN_WINDOW = 2048
MAX_BATCH = 64
READ_CHUNK = 64

Key = tuple[str, str, int]  # (group, topic, queue id)
# The compiled scan of new records (``_v2_codec.lease_scan``), when built: without it, ``_scan``'s
# own loop serves (its twin, ``proxy.v2_codec.PythonV2Codec.lease_scan``, restates it).
_CODEC = v2_codec()


class PopError(Exception):
    """A POP request the book refuses; ``code`` names why ("handle", "not_master", "leases")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Lease(NamedTuple):
    """A message's lease; immutable, so the new messages of one receive share one."""

    deadline_ms: int
    attempt: int
    seq: int
    group_key: str | None = None  # the message group (FIFO), for the blocking rule


@dataclass(frozen=True, slots=True)
class TagFilter:
    """Messages whose tag is one of ``tags``; None: every message."""

    tags: frozenset[str] | None = None

    def __call__(self, msg: StoredMessage) -> bool:
        return self.tags is None or msg.properties.get(PROPERTY_TAGS) in self.tags


@dataclass(slots=True)
class PopQueue:
    next: int = 0
    leases: dict[int, Lease] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def settle(self) -> None:
        """Move ``next`` past offsets that are leased or done (``done`` keeps only those above)."""
        n, done, leases = self.next, self.done, self.leases
        while n in done or n in leases:
            done.discard(n)
            n += 1
        self.next = n

    def committed(self) -> int:
        """Every offset below this one is finished: the group's offset for 4.x tools and lag."""
        return min(self.next, min(self.leases, default=self.next))


@dataclass(slots=True)
class _Turn:
    """One queue's part of a receive: what it reads and what it hands out."""

    group: str
    topic: str
    queue_id: int
    pq: PopQueue
    now: int
    invisible_ms: int
    batch: int
    blocked: set[str]
    granted: list[list[Any]]
    done: list[int]
    out: list[Delivery] = field(default_factory=list)
    taken: int = 0  # messages in ``out``
    # What the scan stopped at in the tier, not in memory: (record offset, units address; -1: not)
    cold: tuple[int, int] | None = None


@dataclass(slots=True)
class Delivery:
    """Messages of one queue handed out under one lease grant: the same ``seq``, attempt and
    deadline (the new messages of a receive, or one message out again)."""

    queue_id: int
    records: list[Any]  # the stored records, memoryview slices of the CommitLog (or bytes)
    offsets: list[int]
    seq: int
    attempt: int
    deadline_ms: int
    body_bytes: int

    def handle(self, i: int) -> str:
        return handle_of(self.queue_id, self.offsets[i], self.seq)


def handle_of(queue_id: int, offset: int, seq: int) -> str:
    return f"{queue_id}:{offset}:{seq:016x}"


def parse_handle(handle: str) -> tuple[int, int, int]:
    """``(queue id, offset, seq)`` of a receipt handle; PopError("handle") if it is not one."""
    parts = handle.split(":") if len(handle) <= 64 else ()
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()) or len(parts[2]) != 16:
        raise PopError("handle", "not a receipt handle this broker issued")
    try:
        return int(parts[0]), int(parts[1]), int(parts[2], 16)
    except ValueError:
        raise PopError("handle", "not a receipt handle this broker issued") from None


class _SeqPool:
    """Random 64-bit lease numbers from the OS's CSPRNG, drawn 512 at a time (one read each)."""

    __slots__ = ("_left",)

    def __init__(self) -> None:
        self._left: list[int] = []

    def __call__(self) -> int:
        if not self._left:
            raw = os.urandom(8 * 512)
            self._left = [int.from_bytes(raw[i : i + 8], "big") for i in range(0, len(raw), 8)]
        return self._left.pop()


_new_seq = _SeqPool()


def now_ms() -> int:
    return int(time.time() * 1000)


class PopService:
    """The lease book of every group consuming this broker's queues by POP (masters only)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.queues: dict[Key, PopQueue] = {}
        self.fifo_groups: set[str] = set()
        self.groups: set[str] = set()  # groups that consumed by POP here (the 4.x/5.x mix rule)
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._records = 0
        self.recovered = False
        self.delivered = 0
        self.acked = 0
        self.dead_lettered = 0

    # --- journal ----------------------------------------------------------------------------------
    def _append(self, queue_id: int, record: list[Any]) -> tuple[PutMessageStatus, int]:
        store = self.broker.store
        assert store is not None
        msg = Message(JOURNAL_TOPIC, orjson.dumps(record), queue_id, born_timestamp=now_ms())
        result, _end = store.entry.append([msg])
        a = result.append
        end = a.wrote_offset + a.wrote_bytes if a is not None else 0
        if queue_id == JOURNAL_QUEUE:
            self._records += 1
        return result.status, end

    async def _journal(self, record: list[Any], *, wait: bool) -> None:
        status, end = self._append(JOURNAL_QUEUE, record)
        if status is not PutMessageStatus.PUT_OK:
            raise PopError("store", f"the lease journal could not be written ({status.name})")
        replication = self.broker.replication
        if wait and replication is not None:
            got = await replication.acknowledged(end)
            if got is not PutMessageStatus.PUT_OK:
                raise PopError("replication", f"the acknowledgement is not replicated ({got.name})")
        elif replication is not None:
            replication.notify()
        if self._records >= SNAPSHOT_EVERY:
            self.snapshot()

    def snapshot(self) -> None:
        store = self.broker.store
        assert store is not None
        covered = store.max_offset_in_queue(JOURNAL_TOPIC, JOURNAL_QUEUE)
        book = [
            [g, t, q, pq.next, [[o, x.deadline_ms, x.attempt, x.seq, x.group_key] for o, x in pq.leases.items()],
             sorted(pq.done)]
            for (g, t, q), pq in self.queues.items()
        ]  # fmt: skip
        self._append(SNAPSHOT_QUEUE, ["S", covered, book, sorted(self.fifo_groups)])
        self._records = 0

    def recover(self) -> None:
        """Rebuild the book from the newest snapshot and the journal records after it."""
        store = self.broker.store
        assert store is not None
        self.queues.clear()
        start = store.min_offset_in_queue(JOURNAL_TOPIC, JOURNAL_QUEUE)
        last = store.max_offset_in_queue(JOURNAL_TOPIC, SNAPSHOT_QUEUE) - 1
        if last >= 0:
            snap = self._read_one(SNAPSHOT_QUEUE, last)
            if snap is not None:
                _s, covered, book, fifo = orjson.loads(snap.body)
                self.fifo_groups.update(fifo)
                for g, t, q, nxt, leases, done in book:
                    pq = self.queues[(g, t, q)] = PopQueue(nxt, {}, set(done))
                    for o, deadline, attempt, seq, gk in leases:
                        pq.leases[o] = Lease(deadline, attempt, seq, gk)
                    self.groups.add(g)
                start = max(start, covered)
        replayed = 0
        end = store.max_offset_in_queue(JOURNAL_TOPIC, JOURNAL_QUEUE)
        offset = start
        while offset < end:
            got = store.get_message(JOURNAL_TOPIC, JOURNAL_QUEUE, offset, READ_CHUNK)
            if got.status is not GetMessageStatus.FOUND:
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset
                continue
            for view in got.messages:
                self._apply(orjson.loads(decode_record(view, check_crc=False).body))
                replayed += 1
            offset = got.next_begin_offset
        self._records = replayed
        self.recovered = True
        log.info("POP leases recovered: %d queues, %d records replayed", len(self.queues), replayed)

    def _read_one(self, queue_id: int, offset: int) -> StoredMessage | None:
        store = self.broker.store
        assert store is not None
        got = store.get_message(JOURNAL_TOPIC, queue_id, offset, 1)
        if got.status is not GetMessageStatus.FOUND or not got.messages:
            return None
        return decode_record(got.messages[0], check_crc=False)

    def _apply(self, rec: list[Any]) -> None:
        kind = rec[0]
        if kind == "R":
            _k, g, t, q, nxt, leases, done, fifo, start = rec
            pq = self.queues.get((g, t, q))
            if pq is None:  # first seen since the snapshot: it started where its first receive did
                pq = self.queues[(g, t, q)] = PopQueue(next=start)
                self.groups.add(g)
            if fifo:
                self.fifo_groups.add(g)
            for o, deadline, attempt, seq, gk in leases:
                pq.leases[o] = Lease(deadline, attempt, seq, gk)
            for o in done:
                pq.leases.pop(o, None)
                pq.done.add(o)
            pq.next = max(pq.next, nxt)
            pq.done = {o for o in pq.done if o >= pq.next}
            pq.settle()
        elif kind == "A":
            _k, g, t, q, offsets = rec
            pq = self.queues.get((g, t, q))
            if pq is None:
                return
            for o in offsets:
                if pq.leases.pop(o, None) is not None and o >= pq.next:
                    pq.done.add(o)
            pq.settle()
        elif kind == "C":
            _k, g, t, q, o, deadline, seq = rec
            cq = self.queues.get((g, t, q))
            held = cq.leases.get(o) if cq is not None else None
            if cq is not None and held is not None:
                cq.leases[o] = held._replace(deadline_ms=deadline, seq=seq)

    def _queue(self, group: str, topic: str, queue_id: int) -> PopQueue:
        key = (group, topic, queue_id)
        pq = self.queues.get(key)
        if pq is None:
            pq = self.queues[key] = PopQueue()
            store = self.broker.store
            assert store is not None
            # A group new to POP starts where its committed offset is, else at the queue's start.
            committed = self.broker.offsets.query(group, topic, queue_id)
            pq.next = committed if committed >= 0 else store.min_offset_in_queue(topic, queue_id)
            self.groups.add(group)
        return pq

    # --- receiving --------------------------------------------------------------------------------
    def _take(
        self,
        group: str,
        topic: str,
        queue_id: int,
        batch: int,
        invisible_ms: int,
        accepts: Callable[[StoredMessage], bool],
        *,
        fifo: bool,
        max_attempts: int,
        record: list[Any],
        dead: list[tuple[int, StoredMessage]],
        cold: list[tuple[int, int]],
    ) -> list[Delivery]:
        """Hand out up to ``batch`` messages of one queue (expired leases first, then new ones);
        what changed goes into ``record`` (leases granted, offsets done). A queue that hands out
        nothing because its scan stopped at a tiered record (or tiered units) not in memory adds
        what it stopped at to ``cold``."""
        pq = self._queue(group, topic, queue_id)
        now = now_ms()
        blocked: set[str] = set()
        if fifo:
            blocked = {x.group_key for x in pq.leases.values() if x.group_key is not None and x.deadline_ms > now}
        turn = _Turn(group, topic, queue_id, pq, now, invisible_ms, batch, blocked, record[5], record[6])
        self._redeliver(turn, fifo=fifo, max_attempts=max_attempts, dead=dead)
        self._scan(turn, accepts, fifo=fifo)
        pq.settle()
        record[4] = pq.next
        if turn.cold is not None and not turn.out:
            cold.append(turn.cold)
        return turn.out

    def _grant(self, t: _Turn, offset: int, lease: Lease, record: Any, body_bytes: int) -> None:
        t.granted.append([offset, lease.deadline_ms, lease.attempt, lease.seq, lease.group_key])
        t.out.append(Delivery(t.queue_id, [record], [offset], lease.seq, lease.attempt, lease.deadline_ms, body_bytes))
        t.taken += 1
        if lease.group_key is not None:
            t.blocked.add(lease.group_key)

    @staticmethod
    def _end(pq: PopQueue, offset: int) -> None:
        del pq.leases[offset]
        if offset >= pq.next:
            pq.done.add(offset)

    def _redeliver(self, t: _Turn, *, fifo: bool, max_attempts: int, dead: list[tuple[int, StoredMessage]]) -> None:
        """Expired leases, in offset order (a FIFO group's oldest first): out again with the
        attempt counted, or, past the last attempt, done and handed to the dead-letter copy."""
        pq = t.pq
        for o in sorted(o for o, x in pq.leases.items() if x.deadline_ms <= t.now):
            if t.taken >= t.batch:
                return
            lease = pq.leases[o]
            if fifo and lease.group_key is not None and lease.group_key in t.blocked:
                continue
            record = self._read_record(t.topic, t.queue_id, o)
            if record is None and self._tiered_not_fetched(t.topic, t.queue_id, o):
                continue  # in object storage, not fetched (the object store is away): next time
            if record is None:  # gone with retention: nothing to deliver
                self._end(pq, o)
                t.done.append(o)
                continue
            msg = decode_record(record, check_crc=False)
            if lease.attempt >= max_attempts:
                dead.append((o, msg))  # ended once its dead-letter copy is stored (receive)
                continue
            lease = pq.leases[o] = Lease(t.now + t.invisible_ms, lease.attempt + 1, _new_seq(), lease.group_key)
            self._grant(t, o, lease, record, len(msg.body))

    def _scan(self, t: _Turn, accepts: Callable[[StoredMessage], bool], *, fifo: bool) -> None:
        """New messages from ``next``, within the scan window."""
        store = self.broker.store
        assert store is not None
        pq = t.pq
        pos = pq.next
        limit = pq.next + SCAN_WINDOW
        # The compiled scan takes what it can judge alone (no FIFO blocking, a tag filter or none);
        # the loop below goes on from where it stopped.
        fast = _CODEC if _CODEC is not None and not fifo and isinstance(accepts, TagFilter) else None
        tags = accepts.tags if isinstance(accepts, TagFilter) else None
        while t.taken < t.batch and pos < limit and len(pq.leases) < MAX_LEASES_PER_QUEUE:
            got = store.get_message(t.topic, t.queue_id, pos, min(READ_CHUNK, limit - pos))
            if got.cold:
                t.cold = (got.cold_offset, got.cold_units)
            if got.status is not GetMessageStatus.FOUND:
                if got.next_begin_offset <= pos or pos >= store.max_offset_in_queue(t.topic, t.queue_id):
                    return
                if pq.next == pos:  # retention removed what was next: go on from what is there
                    pq.next = got.next_begin_offset
                pos = got.next_begin_offset
                continue
            views = got.messages
            if fast is not None:
                lease = Lease(t.now + t.invisible_ms, 1, _new_seq())
                offsets, taken, filtered, looked, after, body_bytes = fast.lease_scan(
                    views, t.topic, pq.leases, pq.done, tags, t.batch - t.taken, lease
                )
                if offsets:  # one lease and one delivery for all of them (an entry each in the journal)
                    t.granted += [[o, lease.deadline_ms, 1, lease.seq, None] for o in offsets]
                    t.out.append(Delivery(t.queue_id, taken, offsets, lease.seq, 1, lease.deadline_ms, body_bytes))
                    t.taken += len(offsets)
                t.done += filtered
                if after >= 0:
                    pos = after
                views = views[looked:]
            for view in views:
                if t.taken >= t.batch:
                    return
                msg = decode_record(view, check_crc=False)
                o = msg.queue_offset
                pos = o + 1
                if o in pq.leases or o in pq.done:
                    continue
                gk = msg.properties.get(PROPERTY_MESSAGE_GROUP) if fifo else None
                if gk is not None and gk in t.blocked:
                    continue  # its group's earlier message is out: it waits its turn
                if not accepts(msg):
                    pq.done.add(o)
                    t.done.append(o)
                    continue
                lease = Lease(t.now + t.invisible_ms, 1, _new_seq(), gk)
                pq.leases[o] = lease
                self._grant(t, o, lease, view, len(msg.body))

    def _tiered_not_fetched(self, topic: str, queue_id: int, offset: int) -> bool:
        store = self.broker.store
        assert store is not None
        return store.get_message(topic, queue_id, offset, 1).cold  # (its record, or its unit)

    async def _fetch_tiered(self, topic: str, queue_id: int, offsets: Iterable[int]) -> None:
        """Bring the tiered messages at these queue offsets into memory (the reads that follow
        never wait on the object store); an unavailable object store leaves them out for now."""
        store = self.broker.store
        assert store is not None
        if store.tier is None:
            return
        try:
            for o in offsets:
                phy = await store.commit_log_offset_in_queue_cold(topic, queue_id, o)
                if phy >= 0 and store.cold(phy):
                    await store.fetch_cold(phy)
        except ObjectStoreError as e:
            log.warning("tiered messages of %s/%d cannot be read now: %s", topic, queue_id, e)

    async def _fetch_cold(self, needs: list[tuple[int, int]]) -> bool:
        """Bring what scans stopped at in the tier into memory (records, units); False when the
        object store cannot be read now."""
        store = self.broker.store
        assert store is not None
        try:
            for record_offset, units in needs:
                await store.fetch_cold_need(record_offset, units)
        except ObjectStoreError as e:
            log.warning("tiered messages cannot be read now: %s", e)
            return False
        return True

    def _read_record(self, topic: str, queue_id: int, offset: int) -> memoryview | None:
        store = self.broker.store
        assert store is not None
        got = store.get_message(topic, queue_id, offset, 1)
        if got.status is not GetMessageStatus.FOUND or not got.messages:
            return None
        return got.messages[0]

    def _read(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        record = self._read_record(topic, queue_id, offset)
        return None if record is None else decode_record(record, check_crc=False)

    async def receive(
        self,
        group: str,
        topic: str,
        queue_ids: Iterable[int],
        batch: int,
        invisible_ms: int,
        accepts: Callable[[StoredMessage], bool],
        *,
        fifo: bool,
        max_attempts: int,
        wait_ms: int,
        dead_letter: Callable[[str, StoredMessage], Any],
    ) -> list[Delivery]:
        """Messages for ``group`` from ``queue_ids`` of ``topic`` (up to ``batch``), waiting up to
        ``wait_ms`` for some to arrive or for a lease to end when there are none."""
        self._check_master()
        batch = max(1, min(batch, MAX_BATCH))
        queue_ids = list(queue_ids)
        deadline = time.monotonic() + wait_ms / 1000
        if fifo:
            self.fifo_groups.add(group)
        while True:
            out: list[Delivery] = []
            count = 0  # messages in ``out``
            cold: list[tuple[int, int]] = []
            for qid in queue_ids:
                if count >= batch:
                    break
                pq = self._queue(group, topic, qid)
                start = pq.next
                if self.broker.store is not None and self.broker.store.tier is not None:
                    now = now_ms()
                    expired = sorted(o for o, x in pq.leases.items() if x.deadline_ms <= now)[:batch]
                    await self._fetch_tiered(topic, qid, [start, *expired])
                record: list[Any] = ["R", group, topic, qid, 0, [], [], fifo, start]
                dead: list[tuple[int, StoredMessage]] = []
                got = self._take(
                    group, topic, qid, batch - count, invisible_ms, accepts,
                    fifo=fifo, max_attempts=max_attempts, record=record, dead=dead, cold=cold,
                )  # fmt: skip
                pq = self.queues[(group, topic, qid)]
                for o, msg in dead:
                    try:
                        await dead_letter(group, msg)
                    except PopError as e:  # the lease stays: the copy is tried again next time
                        log.warning("dead-letter copy for %s of %s/%d@%d refused: %s", group, topic, qid, o, e)
                        continue
                    if o in pq.leases:
                        self._end(pq, o)
                        record[6].append(o)
                    self.dead_lettered += 1
                if dead:
                    pq.settle()
                    record[4] = pq.next
                if got or record[6]:
                    await self._journal(record, wait=bool(record[6]))
                    self._commit(group, topic, qid)
                out += got
                count += sum(len(d.offsets) for d in got)
            if out:
                self.delivered += count
                return out
            # Scans that stopped at tiered messages not fetched yet (past the read-ahead of the
            # first one, e.g. behind many the filter skipped): fetch and read on now; waiting
            # would be for new messages, while these are there already.
            if cold and time.monotonic() < deadline and await self._fetch_cold(cold):
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            await self._wait(group, topic, queue_ids, left)

    async def _wait(self, group: str, topic: str, queue_ids: list[int], timeout_s: float) -> None:
        """Until a message arrives on ``topic``, one of the group's leases on these queues ends,
        or ``timeout_s`` passes."""
        now = now_ms()
        soonest = min(
            (x.deadline_ms for q in queue_ids if (pq := self.queues.get((group, topic, q))) is not None
             for x in pq.leases.values() if x.deadline_ms > now),
            default=None,
        )  # fmt: skip
        if soonest is not None:
            timeout_s = min(timeout_s, (soonest - now) / 1000 + 0.001)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(topic, set())
        waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters.discard(fut)
            if not waiters:
                self._waiters.pop(topic, None)

    def on_stored(self, topic: str, queue_id: int) -> None:
        """The hold service's hook: messages arrived on ``topic``; wake its receivers."""
        waiters = self._waiters.pop(topic, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    # --- acknowledging, changing leases -------------------------------------------------------------
    def _lease(self, group: str, topic: str, handle: str) -> tuple[PopQueue, int, int, Lease]:
        qid, offset, seq = parse_handle(handle)
        pq = self.queues.get((group, topic, qid))
        lease = pq.leases.get(offset) if pq is not None else None
        if pq is None or lease is None or lease.seq != seq:
            raise PopError("handle", "the receipt handle is stale: the message was acknowledged or handed out again")
        return pq, qid, offset, lease

    async def ack(self, group: str, topic: str, handles: list[str]) -> list[PopError | None]:
        """End the leases of ``handles``; one answer each (None: acknowledged)."""
        self._check_master()
        answers: list[PopError | None] = []
        by_queue: dict[int, list[int]] = {}
        for h in handles:
            try:
                pq, qid, offset, _lease = self._lease(group, topic, h)
            except PopError as e:
                answers.append(e)
                continue
            del pq.leases[offset]
            if offset >= pq.next:
                pq.done.add(offset)
            pq.settle()
            by_queue.setdefault(qid, []).append(offset)
            answers.append(None)
        last = len(by_queue) - 1
        for i, (qid, offs) in enumerate(by_queue.items()):
            await self._journal(["A", group, topic, qid, offs], wait=i == last)
            self._commit(group, topic, qid)
            if group in self.fifo_groups:  # a message group's next message may go out now
                self.on_stored(topic, qid)
        self.acked += sum(a is None for a in answers)
        return answers

    async def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str | None:
        """Give the lease of ``handle`` a new deadline; its new handle (the old one stops working),
        or None when its message is gone."""
        self._check_master()
        pq, qid, offset, lease = self._lease(group, topic, handle)
        lease = pq.leases[offset] = lease._replace(deadline_ms=now_ms() + invisible_ms, seq=_new_seq())
        await self._journal(["C", group, topic, qid, offset, lease.deadline_ms, lease.seq], wait=True)
        self.on_stored(topic, qid)  # waiting receivers look again: the lease may end sooner now
        await self._fetch_tiered(topic, qid, [offset])
        if self._read_record(topic, qid, offset) is None:
            return None
        return handle_of(qid, offset, lease.seq)

    def leased_message(self, group: str, topic: str, handle: str) -> StoredMessage | None:
        """The message a live lease holds (PopError for a stale or forged handle)."""
        self._check_master()
        _pq, qid, offset, _lease = self._lease(group, topic, handle)
        return self._read(topic, qid, offset)

    async def finish(self, group: str, topic: str, handle: str) -> None:
        """End a lease without an acknowledgement of success: the caller stored the message's
        dead-letter copy first."""
        self._check_master()
        pq, qid, offset, _lease = self._lease(group, topic, handle)
        del pq.leases[offset]
        if offset >= pq.next:
            pq.done.add(offset)
        pq.settle()
        await self._journal(["A", group, topic, qid, [offset]], wait=True)
        self._commit(group, topic, qid)
        self.on_stored(topic, qid)  # (a FIFO group's next message may go out now)

    def _commit(self, group: str, topic: str, queue_id: int) -> None:
        pq = self.queues.get((group, topic, queue_id))
        if pq is not None:
            self.broker.offsets.commit(group, topic, queue_id, pq.committed())

    def _check_master(self) -> None:
        if not self.broker.writable:
            raise PopError("not_master", "this broker does not take POP requests now (a slave, or fenced)")
        if not self.recovered:
            self.recover()

    def in_flight(self) -> int:
        return sum(len(pq.leases) for pq in self.queues.values())
