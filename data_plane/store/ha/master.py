"""HAService: the master's side of replication (RocketMQ's HAService + HAConnection).

    slave ──connect──▶ HAService (own port) ──▶ one _SlaveConnection per slave:
                          reader task: CHALLENGE → SLAVE_PROOF checked → MASTER_PROOF
                                       (or AUTH_NONE without ``auth``); HANDSHAKE → reply;
                                       only then a slave (``connections``); REPORT frames → acked offset
                          push task:   DATA frames of CommitLog bytes from the agreed offset,
                                       ≤ chunk_bytes each, never crossing a CommitLog file

``wait_for_slave(offset, timeout_ms)`` is what a SYNC_MASTER awaits before answering a send:
waiters sit in a heap ordered by offset; each REPORT that raises the best acknowledged offset
resolves every waiter at or below it in one pass (one wake-up per ack, not per waiter). One
timer sweeps expired waiters (False).

With ``auth`` (a ``LinkAuth``: the broker group and its secret) a peer is a slave only once it
proved it holds the secret (protocol.py); a refusal closes the connection, is counted in
``refused`` by reason and logged as one line naming the peer (``data_plane/refusal_log.py``:
rate-limited per reason). Without ``auth`` the link is
unauthenticated (the broker's single-tenant mode without ``ha_secret_file``).

Everything runs on the event loop that owns the store (the broker's): reads of the mapping
and appends never race.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from crc32c import crc32c

from data_plane.refusal_log import RefusalLog
from data_plane.store.ha.protocol import (
    AUTH_HMAC,
    AUTH_NONE,
    CANDIDATE,
    DATA_HEADER,
    HANDSHAKE_HEAD,
    HANDSHAKE_REPLY,
    LENGTH,
    MAGIC,
    MAX_CANDIDATES,
    MAX_CHUNK_BYTES,
    MAX_DOCUMENT_BYTES,
    MAX_MEMBER_ID,
    METADATA,
    REPLY_RETRY,
    REPLY_STREAM,
    REPORT,
    SLAVE_OFFSETS,
    SLAVE_PROOF,
    VERSION,
    LinkAuth,
    ProtocolError,
    check_slave_proof,
    encode_challenge,
    new_nonce,
)
from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)

_SAMPLES = 4096

# Refusal reasons (``HAService.refused`` keys, the ``orbit.broker.ha.link.refused`` metric).
REFUSED_NO_SECRET = "no_secret"  # this master has no secret yet: it takes no slave
REFUSED_BAD_PROOF = "bad_proof"  # a proof made with another secret or group, or a replayed one
REFUSED_TIMEOUT = "auth_timeout"  # no proof within the deadline
REFUSED_CLOSED = "closed_in_auth"  # the peer closed the connection before its proof


@dataclass(frozen=True, slots=True)
class SlaveLag:
    """Replication lag of one connected slave, as the master sees it."""

    peer: str
    acked_offset: int  # -1 before its first report
    lag_bytes: int  # master max offset - acked offset
    lag_seconds: float  # store time of the master's newest record - of the slave's newest


class _SlaveConnection:
    def __init__(self, service: HAService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service = service
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.acked = -1
        self.next_offset = -1
        self.member_id: int | None = None  # the broker id its handshake named
        self.wake = asyncio.Event()
        # (log offset at a record boundary, store timestamp of the record ending there): the
        # newest sample at or below the acked offset dates the slave's newest record.
        self.samples: collections.deque[tuple[int, int]] = collections.deque(maxlen=_SAMPLES)
        self.acked_ts = -1
        self.bytes_sent = 0
        self.metadata_sent: bytes | None = None
        self.metadata_at = 0.0
        self.metadata_version = -1

    async def run(self) -> None:
        push: asyncio.Task[None] | None = None
        try:
            if not await self._authenticate():
                return
            start = await self._handshake()
            self.next_offset = start
            # A slave from now on: what SYNC_MASTER sends wait for, and what notify() wakes.
            self.service.connections.add(self)
            push = asyncio.create_task(self._push(), name=f"ha-push-{self.peer}")
            # A push task that ends (an error) ends the connection: it must not stay counted as
            # a slave that SYNC_MASTER sends could wait for.
            push.add_done_callback(lambda _t: self.writer.close())
            while True:
                (offset,) = REPORT.unpack(await self.reader.readexactly(REPORT.size))
                if offset == SLAVE_OFFSETS:
                    (size,) = LENGTH.unpack(await self.reader.readexactly(LENGTH.size))
                    if size > MAX_DOCUMENT_BYTES:
                        raise ProtocolError(f"an offsets document of {size} bytes")
                    doc = await self.reader.readexactly(size)
                    if self.service.on_slave_offsets is not None:
                        self.service.on_slave_offsets(doc)
                    continue
                if not 0 <= offset <= self.next_offset:
                    # A slave can only hold what this connection sent it: anything else would
                    # resolve SYNC_MASTER waiters for bytes no slave has.
                    raise ProtocolError(f"report of offset {offset}, past the {self.next_offset} sent")
                self._on_report(offset)
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, OSError) as e:
            log.info("HA connection from %s closed: %s", self.peer, e or type(e).__name__)
        finally:
            # Not counted as a slave from this moment (SYNC_MASTER waits must not lean on it),
            # however long the socket takes to close.
            self.service.connections.discard(self)
            if push is not None:
                push.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await push
            self.writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.writer.wait_closed(), 5)

    # --- authentication ---------------------------------------------------------------------
    async def _authenticate(self) -> bool:
        """The link's authentication (protocol.py): True once the peer proved it holds the
        group's secret, or at once on an unauthenticated link (no ``auth``); False after a
        refusal (counted and logged; the caller closes the connection)."""
        service = self.service
        auth = service.auth
        nonce = new_nonce()
        if auth is None:
            self.writer.write(encode_challenge(AUTH_NONE, nonce))
            await self.writer.drain()
            return True
        secret = service.current_secret(auth)
        if secret is None:
            service.refuse(self.peer, REFUSED_NO_SECRET, "this master has no HA link secret yet")
            return False
        try:
            async with asyncio.timeout(auth.timeout_ms / 1000):
                self.writer.write(encode_challenge(AUTH_HMAC, nonce))
                await self.writer.drain()
                checked = check_slave_proof(secret, auth.group, nonce, await self.reader.readexactly(SLAVE_PROOF.size))
                if checked is None:
                    service.refuse(
                        self.peer, REFUSED_BAD_PROOF, f"its proof is not one of a member of group {auth.group!r}"
                    )
                    return False
                self.writer.write(checked[1])
                await self.writer.drain()
        except TimeoutError:
            service.refuse(self.peer, REFUSED_TIMEOUT, f"no proof within {auth.timeout_ms} ms")
            return False
        except asyncio.IncompleteReadError:
            service.refuse(self.peer, REFUSED_CLOSED, "closed the connection before its proof")
            return False
        log.info("HA slave %s authenticated for group %s", self.peer, auth.group)
        return True

    # --- handshake -------------------------------------------------------------------------
    async def _handshake(self) -> int:
        while True:
            head = await self.reader.readexactly(HANDSHAKE_HEAD.size)
            magic, version, member, slave_max, count = HANDSHAKE_HEAD.unpack(head)
            if magic != MAGIC or version != VERSION:
                raise ProtocolError(f"not an Orbit HA handshake (magic {magic:#x}, version {version})")
            if not -1 <= member <= MAX_MEMBER_ID:
                raise ProtocolError(f"member id {member}")
            self.member_id = member if member >= 0 else None
            if count > MAX_CANDIDATES:
                raise ProtocolError(f"{count} candidates")
            raw = await self.reader.readexactly(count * CANDIDATE.size)
            candidates = [CANDIDATE.unpack_from(raw, i * CANDIDATE.size) for i in range(count)]
            code, offset = self.service.decide_start(slave_max, candidates)
            store = self.service.store
            self.writer.write(HANDSHAKE_REPLY.pack(code, offset, store.max_phy_offset(), self.service.epoch()))
            await self.writer.drain()
            log.info(
                "HA slave %s reports max offset %d: %s %d",
                self.peer,
                slave_max,
                "stream from" if code == REPLY_STREAM else "retry below",
                offset,
            )
            if code == REPLY_STREAM:
                ts = store.commit_log.store_timestamp_at(offset)
                if ts > 0:  # the first record the slave lacks: its newest is no later
                    self.samples.append((offset, ts))
                return offset

    # --- streaming -------------------------------------------------------------------------
    async def _push(self) -> None:
        service = self.service
        store = service.store
        cl = store.commit_log
        writer = self.writer
        heartbeat_s = service.heartbeat_interval_ms / 1000
        poll_s = service.poll_interval_ms / 1000
        last_write = time.monotonic()
        while True:
            if service.metadata is not None and (
                self.metadata_version != service.metadata_version
                or time.monotonic() - self.metadata_at >= service.metadata_interval_s
            ):
                await self._send_metadata()
            top = cl.max_offset()
            if not self.samples or self.samples[-1][0] < top:
                self.samples.append((top, cl.last_store_timestamp))
            nxt = self.next_offset
            if nxt < top:
                mf = cl.mfq.find_by_offset(nxt)
                if mf is None:
                    raise ProtocolError(f"offset {nxt} is no longer in the master's log")
                pos = nxt - mf.file_from_offset
                n = min(service.chunk_bytes, mf.wrote_position - pos)
                if n > 0:
                    data = bytes(mf.mv[pos : pos + n])
                    writer.write(DATA_HEADER.pack(nxt, n))
                    writer.write(data)
                    self.next_offset = nxt + n
                    self.bytes_sent += n
                    last_write = time.monotonic()
                    await writer.drain()
                    continue
            if time.monotonic() - last_write >= heartbeat_s:
                writer.write(DATA_HEADER.pack(self.next_offset, 0))
                last_write = time.monotonic()
                await writer.drain()
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), poll_s)

    async def _send_metadata(self) -> None:
        """The broker's metadata when it changed since this slave last got it (looked at every
        ``metadata_interval_ms``)."""
        assert self.service.metadata is not None
        self.metadata_at = time.monotonic()
        self.metadata_version = self.service.metadata_version
        doc = self.service.metadata()
        if doc is None or doc == self.metadata_sent:
            return
        if len(doc) > MAX_DOCUMENT_BYTES:
            log.error("metadata of %d bytes is over %d: not replicated", len(doc), MAX_DOCUMENT_BYTES)
            return
        self.writer.write(DATA_HEADER.pack(METADATA, len(doc)))
        self.writer.write(doc)
        self.metadata_sent = doc
        await self.writer.drain()

    def _on_report(self, offset: int) -> None:
        if offset < self.acked:
            log.warning("HA slave %s went back from %d to %d", self.peer, self.acked, offset)
        self.acked = offset
        samples = self.samples
        while samples and samples[0][0] <= offset:
            self.acked_ts = samples.popleft()[1]
        self.service.on_ack(offset)


class HAService:
    """The master's replication endpoint. ``await start()``, then slaves connect to ``port``."""

    def __init__(
        self,
        store: MessageStore,
        *,
        host: str = "0.0.0.0",
        port: int = 10912,
        chunk_bytes: int = 256 * 1024,
        heartbeat_interval_ms: int = 5_000,
        poll_interval_ms: int = 100,
        max_gap_not_in_sync_bytes: int = 256 * 1024 * 1024,
        metadata: Callable[[], bytes | None] | None = None,
        metadata_interval_ms: int = 1_000,
        on_slave_offsets: Callable[[bytes], None] | None = None,
        auth: LinkAuth | None = None,
        refused: collections.Counter[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        epoch: Callable[[], int] | None = None,
    ) -> None:
        if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be 1..{MAX_CHUNK_BYTES}")
        self.store = store
        self.host = host
        self.port = port
        self.chunk_bytes = chunk_bytes
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.poll_interval_ms = poll_interval_ms
        self.max_gap_not_in_sync_bytes = max_gap_not_in_sync_bytes
        # The broker's metadata document (None: unchanged or nothing to send), sent to each
        # slave when it differs from what that slave last got; slaves' offset documents go back.
        self.metadata = metadata
        self.metadata_interval_s = metadata_interval_ms / 1000
        self.on_slave_offsets = on_slave_offsets
        self.metadata_version = 0
        # None: an unauthenticated link. Refusals by reason (a caller's counter outlives this
        # service: a broker whose role changes makes a new one).
        self.auth = auth
        self.ssl_context = ssl_context  # TLS only on the HA port when given (members are ours)
        # The failover epoch this master serves, told to each slave in the handshake reply.
        self.epoch: Callable[[], int] = epoch if epoch is not None else (lambda: 0)
        self.refused: collections.Counter[str] = refused if refused is not None else collections.Counter()
        self._refusal_log = RefusalLog(log, "HA connections refused", counts=self.refused)
        self._no_secret_logged = False
        # Authenticated slaves past their handshake, the only ones SYNC_MASTER sends count on.
        self.connections: set[_SlaveConnection] = set()
        self.max_acked_offset = -1  # best offset any slave has acknowledged (this master's run)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # (offset, seq, future) by offset; (deadline, seq, future) by deadline
        self._by_offset: list[tuple[int, int, asyncio.Future[bool]]] = []
        self._by_deadline: list[tuple[float, int, asyncio.Future[bool]]] = []
        self._seq = itertools.count()
        self._sweeper: asyncio.TimerHandle | None = None

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, ssl=self.ssl_context,
            ssl_handshake_timeout=10.0 if self.ssl_context is not None else None,
        )  # fmt: skip
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("HA service listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._resolve_all(False)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _SlaveConnection(self, reader, writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass  # stop(): end quietly (the stream server would log a cancelled handler)
        finally:
            self.connections.discard(conn)
            if task is not None:
                self._tasks.discard(task)

    # --- refusals -------------------------------------------------------------------------
    def refuse(self, peer: str, reason: str, detail: str) -> None:
        """Count and log (rate-limited) a connection refused by the link's authentication."""
        self._refusal_log(reason, "HA link: refused %s (%s): %s", peer, reason, detail)

    def current_secret(self, auth: LinkAuth) -> bytes | None:
        """The group's secret now. Without one every slave is refused: said once, until one
        arrives."""
        secret = auth.secret()
        if secret is None and not self._no_secret_logged:
            log.error(
                "HA link of group %s: no secret yet, so no slave is accepted until one arrives "
                "(ha_secret_file, or the control plane's tenancy sync)", auth.group,
            )  # fmt: skip
        self._no_secret_logged = secret is None
        return secret

    # --- where a slave starts --------------------------------------------------------------
    def decide_start(self, slave_max: int, candidates: list[tuple[int, int, int]]) -> tuple[int, int]:
        """(REPLY_STREAM, offset) or (REPLY_RETRY, offset): see docs/ha.md, "Divergence".

        The newest candidate record whose bytes are identical on the master is the common
        point; no match means every candidate lies past it (the logs share a prefix), so the
        slave drops them and offers older records."""
        cl = self.store.commit_log
        mmin, mmax = cl.min_offset(), cl.max_offset()
        if not candidates:
            if slave_max == 0:
                return REPLY_STREAM, mmin
            if mmin <= slave_max <= mmax:
                return REPLY_STREAM, slave_max
            return REPLY_RETRY, 0
        for offset, size, crc in candidates:
            if offset < mmin or offset + size > mmax:
                continue
            data = cl.read(offset, size)
            if data is not None and crc32c(data) == crc:
                return REPLY_STREAM, offset + size
        return REPLY_RETRY, min(c[0] for c in candidates)

    # --- notifications and acknowledgements ------------------------------------------------
    def notify(self) -> None:
        """New bytes in the log: wake the push tasks (the broker calls this after appends;
        otherwise they look every ``poll_interval_ms``)."""
        for conn in self.connections:
            conn.wake.set()

    def metadata_changed(self) -> None:
        """Topics or groups changed: every slave gets the metadata now, not at the next interval
        (a topic must not be missing on a slave that holds its messages)."""
        self.metadata_version += 1
        self.notify()

    def on_ack(self, offset: int) -> None:
        if offset <= self.max_acked_offset:
            return
        self.max_acked_offset = offset
        heap = self._by_offset
        while heap and heap[0][0] <= offset:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(True)

    def is_slave_ok(self, offset: int) -> bool:
        """RocketMQ's isSlaveOK: a slave is connected and not too far behind ``offset`` to wait
        for (otherwise a SYNC_MASTER answers SLAVE_NOT_AVAILABLE at once)."""
        return any(c.acked >= 0 and offset - c.acked < self.max_gap_not_in_sync_bytes for c in self.connections)

    def in_sync(self, offset: int) -> list[int]:
        """The member ids of the slaves holding the log up to ``offset`` (everything this
        master acknowledged): the in-sync set it reports for failover."""
        return sorted({c.member_id for c in self.connections if c.member_id is not None and c.acked >= offset})

    async def wait_for_slave(self, offset: int, timeout_ms: int) -> bool:
        """True once some slave has acknowledged the log up to ``offset`` (the end of a
        send's bytes); False after ``timeout_ms`` (no slave, a slave stopped or too slow)."""
        if self.max_acked_offset >= offset:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        seq = next(self._seq)
        heapq.heappush(self._by_offset, (offset, seq, fut))
        heapq.heappush(self._by_deadline, (loop.time() + timeout_ms / 1000, seq, fut))
        self._schedule_sweep(loop)
        self.notify()
        return await fut

    def _schedule_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """One timer, at the earliest deadline."""
        if not self._by_deadline:
            return
        when = self._by_deadline[0][0]
        if self._sweeper is not None:
            if self._sweeper.when() <= when:
                return
            self._sweeper.cancel()
        self._sweeper = loop.call_at(when, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        now = loop.time()
        heap = self._by_deadline
        while heap and (heap[0][2].done() or heap[0][0] <= now):
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(False)
        if not self._by_offset or len(self._by_offset) > 2 * len(heap) + 64:
            self._by_offset = [w for w in self._by_offset if not w[2].done()]
            heapq.heapify(self._by_offset)
        self._schedule_sweep(loop)

    def _resolve_all(self, result: bool) -> None:
        for _, _, fut in self._by_offset:
            if not fut.done():
                fut.set_result(result)
        self._by_offset.clear()
        self._by_deadline.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    # --- metrics ---------------------------------------------------------------------------
    def lag(self) -> list[SlaveLag]:
        """Per connected slave: bytes and seconds behind this master."""
        cl = self.store.commit_log
        top = cl.max_offset()
        newest = cl.last_store_timestamp
        out = []
        for c in self.connections:
            behind = top - c.acked if c.acked >= 0 else top
            if c.acked >= top:
                secs = 0.0
            elif c.acked_ts > 0 and newest > 0:
                secs = max(0, newest - c.acked_ts) / 1000
            else:
                secs = float("nan")
            out.append(SlaveLag(c.peer, c.acked, behind, secs))
        return out
