"""HAClient: the slave's side of replication (RocketMQ's HAClient).

    connect ─▶ CHALLENGE ─▶ SLAVE_PROOF ─▶ MASTER_PROOF checked (with ``auth``; AUTH_NONE without)
            ─▶ HANDSHAKE (max offset + its last records' CRCs) ─▶ reply
       RETRY(o):  truncate to o, handshake again          (diverged: walk back)
       STREAM(o): truncate to o if longer, then
                  DATA frames ─▶ MessageStore.append_raw (the store's dispatcher builds the
                  ConsumeQueues and IndexFiles) ─▶ REPORT after each frame and every
                  report_interval_ms
    connection lost / master down ─▶ reconnect with exponential backoff

With ``auth`` (a ``LinkAuth``) the slave takes nothing from a master that has not proved it
holds the group's secret, refuses one that offers an unauthenticated link, and does not connect
at all while it has no secret (said once; ``wake()`` when one arrives). Without ``auth`` it
follows a master that offers an unauthenticated link only.

Runs on the event loop that owns the slave's store.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Callable

from crc32c import crc32c

from data_plane.store.ha.protocol import (
    AUTH_NONE,
    AUTH_TIMEOUT_MS,
    CHALLENGE,
    DATA_HEADER,
    HANDSHAKE_REPLY,
    LENGTH,
    MASTER_PROOF,
    MAX_CANDIDATES,
    MAX_CHUNK_BYTES,
    MAX_DOCUMENT_BYTES,
    METADATA,
    REPLY_RETRY,
    REPLY_STREAM,
    REPORT,
    SLAVE_OFFSETS,
    LinkAuth,
    LinkAuthError,
    ProtocolError,
    check_master_proof,
    decode_challenge,
    encode_handshake,
    encode_slave_proof,
    new_nonce,
)
from data_plane.store.message_store import MessageStore
from data_plane.tasks import cancel_all

log = logging.getLogger(__name__)

STALE_MASTER_RETRY_MS = 250  # a master behind the epoch this slave knows of: asked again this soon


def last_records(store: MessageStore, limit: int = MAX_CANDIDATES) -> list[tuple[int, int, int]]:
    """The newest ``limit`` whole records of the log (an end-of-file blank counts as one) as
    (offset, size, CRC-32C of the bytes), newest first, from the file holding the log's last
    byte (when it holds too few, nothing older: a RETRY walks further back). The records are
    walked from the ``limit``-th newest one the ConsumeQueues name in that file
    (``ConsumeQueueTable.newest_record_start``): about ``limit`` records whatever the file's size,
    the whole file only when the queues name fewer there. Blocking (the HA client runs it on a
    worker thread)."""
    cl = store.commit_log
    top = cl.max_offset()
    if top <= cl.min_offset():
        return []
    mf = cl.mfq.find_by_offset(top - 1)
    if mf is None:
        return []
    floor = max(mf.file_from_offset, cl.min_offset())
    start = store.queues.newest_record_start(floor, limit)
    while True:
        spans: collections.deque[tuple[int, int]] = collections.deque(maxlen=limit)
        prev = start
        for end, _req in cl.scan(start, check_crc=False):
            spans.append((prev, end - prev))
            prev = end
        if len(spans) == limit or start == floor:
            break
        start = floor  # (the queues named a start the records do not bear out: the whole file)
    out = []
    for offset, size in reversed(spans):
        data = cl.read(offset, size)
        if data is not None:
            out.append((offset, size, crc32c(data)))
    return out


class HAClient:
    """Replicates the master at ``master_host:master_port`` into ``store``: ``start()`` /
    ``await stop()``."""

    def __init__(
        self,
        store: MessageStore,
        master_host: str,
        master_port: int,
        *,
        report_interval_ms: int = 1_000,
        reconnect_initial_ms: int = 100,
        reconnect_max_ms: int = 5_000,
        connect_timeout_ms: int = 3_000,
        idle_timeout_ms: int = 20_000,
        on_metadata: Callable[[bytes], None] | None = None,
        offsets_to_report: Callable[[], bytes | None] | None = None,
        auth: LinkAuth | None = None,
        ssl_context: ssl.SSLContext | None = None,
        member_id: int = -1,
        min_master_epoch: Callable[[], int] | None = None,
        on_master_epoch: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.master_host = master_host
        self.master_port = master_port
        self.report_interval_ms = report_interval_ms
        self.reconnect_initial_ms = reconnect_initial_ms
        self.reconnect_max_ms = reconnect_max_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.idle_timeout_ms = idle_timeout_ms  # no frame (not even a heartbeat) for this long: reconnect
        # The master's metadata documents go to on_metadata; offsets_to_report is asked with
        # every report for consumer offsets committed here to send back (None: nothing).
        self.on_metadata = on_metadata
        self.offsets_to_report = offsets_to_report
        self.auth = auth
        self.ssl_context = ssl_context  # TLS to the master's HA port, verifying it, when given
        # This slave's broker id, told in the handshake (the master's in-sync set names it); a
        # master serving an epoch below min_master_epoch() is refused before anything is
        # truncated (a stale master); on_master_epoch(epoch) once a master's stream starts.
        self.member_id = member_id
        self.min_master_epoch = min_master_epoch
        self.on_master_epoch = on_master_epoch
        self.master_epoch = -1
        self.stale_masters = 0
        self.auth_failures = 0  # sessions ended by the link's authentication
        self.connected = False
        self.master_max_offset = -1
        self.bytes_received = 0
        self.chunks_received = 0
        self.truncations = 0
        self.connects = 0
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._position = 0  # the end of what the current session received
        self._stopping = False
        self._wake = asyncio.Event()
        self._said = ""  # the last authentication problem logged as a warning

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="ha-client")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None
        self.connected = False

    def update_master_address(self, host: str, port: int) -> None:
        """Follow another master (failover): takes effect on the next connect (``reconnect``)."""
        self.master_host, self.master_port = host, port

    def reconnect(self) -> None:
        """Drop the current connection, if any: the next one goes to the current address."""
        if self._writer is not None:
            self._writer.close()

    def wake(self) -> None:
        """Connect now rather than after the current backoff (the link's secret arrived)."""
        self._wake.set()

    async def _pause(self, ms: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), ms / 1000)
        self._wake.clear()

    def _auth_problem(self, message: str) -> None:
        """A warning the first time, and when the problem changes; the same again only at info."""
        self.auth_failures += 1
        log.log(logging.WARNING if message != self._said else logging.INFO, "HA link to %s:%d: %s",
                self.master_host, self.master_port, message)  # fmt: skip
        self._said = message

    async def _run(self) -> None:
        backoff = self.reconnect_initial_ms
        while not self._stopping:
            if self.auth is not None and self.auth.secret() is None:
                if self._said != "no secret":
                    log.warning(
                        "HA link of group %s: no secret yet, not connecting to the master until one arrives "
                        "(ha_secret_file, or the control plane's tenancy sync)", self.auth.group,
                    )  # fmt: skip
                    self._said = "no secret"
                await self._pause(self.reconnect_max_ms)
                continue
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        self.master_host,
                        self.master_port,
                        ssl=self.ssl_context,
                        server_hostname=self.master_host if self.ssl_context is not None else None,
                    ),
                    self.connect_timeout_ms / 1000,
                )
            except (OSError, TimeoutError) as e:
                log.info("HA master %s:%d unreachable: %s", self.master_host, self.master_port, e)
            else:
                self.connects += 1
                self._writer = writer
                chunks_before = self.chunks_received
                stale_before = self.stale_masters
                try:
                    await self._session(reader, writer)
                except LinkAuthError as e:
                    self._auth_problem(str(e))
                except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, OSError, TimeoutError) as e:
                    log.info("HA connection to %s:%d lost: %s", self.master_host, self.master_port, e or type(e))
                except Exception:
                    log.exception("HA session with %s:%d failed", self.master_host, self.master_port)
                finally:
                    if self.chunks_received > chunks_before:  # it worked for a while: retry soon
                        backoff = self.reconnect_initial_ms
                    elif self.stale_masters > stale_before:  # it may take its new epoch any moment
                        backoff = min(backoff, STALE_MASTER_RETRY_MS)
                    self.connected = False
                    self._writer = None
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
            await self._pause(backoff)
            backoff = min(backoff * 2, self.reconnect_max_ms)

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The link's authentication (protocol.py): returns once the master proved it holds the
        group's secret (or, without ``auth``, offered an unauthenticated link); LinkAuthError
        otherwise."""
        auth = self.auth
        timeout_ms = auth.timeout_ms if auth is not None else AUTH_TIMEOUT_MS
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                mode, master_nonce = decode_challenge(await reader.readexactly(CHALLENGE.size))
                if mode == AUTH_NONE:
                    if auth is not None:
                        raise LinkAuthError("the master offers an unauthenticated link; this slave requires one")
                    return
                if auth is None:
                    raise LinkAuthError(
                        "the master requires an authenticated link and this slave has no secret "
                        "(ha_secret_file, or auth_enabled with the control plane)"
                    )
                secret = auth.secret()
                if secret is None:
                    raise LinkAuthError("no secret yet")
                slave_nonce = new_nonce()
                writer.write(encode_slave_proof(secret, auth.group, master_nonce, slave_nonce))
                await writer.drain()
                try:
                    frame = await reader.readexactly(MASTER_PROOF.size)
                except asyncio.IncompleteReadError:
                    raise LinkAuthError(
                        f"the master refused this slave's proof (another secret, or not group {auth.group!r})"
                    ) from None
                if not check_master_proof(secret, auth.group, master_nonce, slave_nonce, frame):
                    raise LinkAuthError(f"the master's proof is wrong: not a master of group {auth.group!r}")
        except TimeoutError:
            raise LinkAuthError(f"authentication not done within {timeout_ms} ms") from None
        except asyncio.IncompleteReadError:
            raise LinkAuthError("the master closed the link before its challenge (it may have no secret yet)") from None

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        store = self.store
        idle_s = self.idle_timeout_ms / 1000
        await self._authenticate(reader, writer)
        if self._said:
            log.info("HA link to %s:%d authenticated", self.master_host, self.master_port)
            self._said = ""
        offset, epoch = await self._handshake(reader, writer)
        expected = offset
        self._position = offset
        self.connected = True
        if self.on_master_epoch is not None:
            self.on_master_epoch(epoch)  # this log is now a prefix of that epoch's log
        log.info("HA replicating from %s:%d at offset %d", self.master_host, self.master_port, offset)
        reporter = asyncio.create_task(self._report_loop(writer), name="ha-report")
        try:
            while True:
                header = await asyncio.wait_for(reader.readexactly(DATA_HEADER.size), idle_s)
                phy, size = DATA_HEADER.unpack(header)
                if size == 0:
                    continue  # heartbeat
                if phy == METADATA:
                    if size > MAX_DOCUMENT_BYTES:
                        raise ProtocolError(f"a metadata document of {size} bytes")
                    doc = await asyncio.wait_for(reader.readexactly(size), idle_s)
                    if self.on_metadata is not None:
                        self.on_metadata(doc)
                    continue
                if size > MAX_CHUNK_BYTES:
                    raise ProtocolError(f"data frame of {size} bytes")
                body = await asyncio.wait_for(reader.readexactly(size), idle_s)
                if phy != expected:
                    raise ProtocolError(f"data at {phy}, expected {expected}")
                expected = store.append_raw(body, phy, dispatch=False)
                self.bytes_received += size
                self.chunks_received += 1
                self._position = expected
                writer.write(REPORT.pack(expected))  # acknowledged once written, then indexed
                store.dispatch_pending()
        finally:
            await cancel_all([reporter])

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, int]:
        """Handshake until the master says where to stream from: (that offset, its epoch)."""
        store = self.store
        idle_s = self.idle_timeout_ms / 1000
        while True:  # handshake until the master says where to stream from
            candidates = await asyncio.to_thread(last_records, store)
            writer.write(encode_handshake(store.max_phy_offset(), candidates, self.member_id))
            await writer.drain()
            code, offset, master_max, epoch = HANDSHAKE_REPLY.unpack(
                await asyncio.wait_for(reader.readexactly(HANDSHAKE_REPLY.size), idle_s)
            )
            least = self.min_master_epoch() if self.min_master_epoch is not None else 0
            if epoch < least:
                self.stale_masters += 1
                raise ProtocolError(f"the master serves epoch {epoch}, older than epoch {least} this slave knows of")
            self.master_epoch = epoch
            self.master_max_offset = master_max
            if code == REPLY_RETRY:
                await self._truncate(offset)
                continue
            if code != REPLY_STREAM:
                raise ProtocolError(f"unknown handshake reply {code}")
            if offset < store.max_phy_offset():
                await self._truncate(offset)
            elif offset > store.max_phy_offset() and store.max_phy_offset() > store.min_phy_offset():
                raise ProtocolError(f"master streams from {offset}, past this log's end {store.max_phy_offset()}")
            return offset, epoch

    async def _report_loop(self, writer: asyncio.StreamWriter) -> None:
        interval = self.report_interval_ms / 1000
        while True:
            # What this session received from the master (never bytes written here otherwise).
            writer.write(REPORT.pack(self._position))
            if self.offsets_to_report is not None and (doc := self.offsets_to_report()) is not None:
                writer.write(REPORT.pack(SLAVE_OFFSETS) + LENGTH.pack(len(doc)))
                writer.write(doc)
            await writer.drain()
            await asyncio.sleep(interval)

    async def _truncate(self, offset: int) -> None:
        """Cut the log back to ``offset``: in memory on the loop (``MessageStore.cut_log``, in
        proportion to what is cut), its disk work on a worker thread. Nothing is appended before
        that work is done: a stop arriving meanwhile waits for it."""
        started = time.monotonic()
        before = self.store.max_phy_offset()
        cut = self.store.cut_log(offset)
        on_loop_ms = (time.monotonic() - started) * 1000
        if cut is not None:
            finishing = asyncio.ensure_future(asyncio.to_thread(cut.finish))
            try:
                await asyncio.shield(finishing)
            except asyncio.CancelledError:
                await asyncio.wait([finishing])
                if not finishing.cancelled() and finishing.exception() is not None:
                    log.error("finishing the cut to %d failed", offset, exc_info=finishing.exception())
                raise
        self.truncations += 1
        log.warning(
            "HA slave log truncated from %d to %d to match the master (%.1f ms on the loop, %.1f ms in all)",
            before,
            offset,
            on_loop_ms,
            (time.monotonic() - started) * 1000,
        )
