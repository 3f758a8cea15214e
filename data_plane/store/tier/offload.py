"""The offloader: a thread that copies sealed CommitLog files to object storage and applies
tier retention, for the group's master only.

A round (every ``tier_check_interval_ms``, or when woken):

* **Not the master** (the store is fenced — a slave, or a master that lost its lease): read the
  group's manifest so that local retention and cold reads know what the tier holds. Never
  upload, never delete.
* **The master, first round of its tenure:** read the manifest (a new master after a failover
  goes on from it) and abort the multipart uploads a crash left unfinished under the group.
* **Upload:** oldest first, every file that is sealed (a later file exists), older than
  ``tier_after_hours`` and wholly below the group's *agreed* offset — the bytes every member
  that could become master holds (``MessageStore.tier_safe_offset``) — so that no object ever
  holds a record a failover could take back. Each upload is verified (size and multipart ETag);
  the file's index object (``file_index``: its ConsumeQueue units and key entries, built from
  its records) follows it; then the manifest is written (remote first, then the local copy) and
  published to readers.
* **Tier retention:** tiered files whose every topic is past its own retention
  (``topic_retention_hours``; unlimited never is) leave the manifest first, then the bucket.

An object-store failure ends the round; the next round tries again. Nothing local is deleted
here: retention (on the loop) deletes a local file only once the manifest names it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from data_plane.store.layouts import MESSAGE_MAGIC_CODE, RECORD_HEADER
from data_plane.store.message import MAGIC_AND_SIZE, OFF_STORE_TIMESTAMP, STORE_TIMESTAMP
from data_plane.store.tier import file_index
from data_plane.store.tier.manifest import TieredFile
from data_plane.store.tier.object_store import ObjectStoreError
from data_plane.store.tier.offload_workers import OffloadWorkers

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore
    from data_plane.store.tier.tier import Tier

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
_HEAD = RECORD_HEADER.size


def first_store_timestamp(path: str) -> int | None:
    """The store time of a CommitLog file's first record (read from the file, not its mapping:
    this runs off the loop). None when the file holds no record yet."""
    try:
        with open(path, "rb", buffering=0) as f:
            head = os.pread(f.fileno(), _HEAD, 0)
    except OSError:
        return None
    if len(head) < _HEAD:
        return None
    total, magic = MAGIC_AND_SIZE.unpack_from(head, 0)
    if magic != MESSAGE_MAGIC_CODE or total <= 0:
        return None
    return int(STORE_TIMESTAMP.unpack_from(head, OFF_STORE_TIMESTAMP)[0])


class Offloader:
    def __init__(self, store: MessageStore, tier: Tier) -> None:
        self._store = store
        self._tier = tier
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tenure = False  # this store is the master and has read the manifest since it became one
        self._round_lock = threading.Lock()  # one round at a time (the thread's, or a caller's)
        self.workers = OffloadWorkers(idle=store.config.tier_offload_idle)  # uploads and index builds
        # Figures (runtime info).
        self.uploaded_files = 0
        self.uploaded_bytes = 0
        self.upload_seconds = 0.0
        self.deleted_files = 0
        self.last_error = ""
        self.waiting_files = 0  # sealed files old enough that are not in the tier yet

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tier-offload", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._round_lock:
            self.workers.shutdown()

    def _run(self) -> None:
        interval = self._store.config.tier_check_interval_ms / 1000
        while not self._stop.is_set():
            try:
                self.round()
                self.last_error = ""
            except ObjectStoreError as e:
                if self.last_error != str(e):
                    log.warning("tier: object store unavailable, offload waits: %s", e)
                self.last_error = str(e)
            except Exception as e:  # a bad round must not end the offloader
                log.exception("tier offload round failed")
                self.last_error = repr(e)
            self._wake.wait(interval)
            self._wake.clear()

    # --- one round ------------------------------------------------------------------------------
    def round(self) -> None:
        """One round now, on the caller's thread (after any round under way)."""
        with self._round_lock:
            self._round()

    def _round(self) -> None:
        store, tier = self._store, self._tier
        if store.fenced:
            self._tenure = False
            tier.refresh()
            return
        if not self._tenure:
            tier.refresh()
            tier.abort_stale_uploads()
            self._tenure = True
        self._upload_ready()
        self._apply_tier_retention()

    def _candidates(self) -> list[tuple[int, str, int, int]]:
        """(from offset, path, length, newest store ms) of the sealed files to upload, oldest first."""
        store = self._store
        cfg = store.config
        files = list(store.commit_log.mfq.files)  # a snapshot: the loop may add or drop files
        safe = store.tier_safe_offset()
        cutoff_ms = store.clock_ms() - cfg.tier_after_hours * HOUR_MS
        manifest = self._tier.manifest
        out = []
        for mf, nxt in itertools.pairwise(files):
            if manifest.has(mf.file_from_offset):
                continue
            if nxt.file_from_offset > safe:
                break  # not every member that could become master holds all of it yet
            newest = first_store_timestamp(nxt.path)
            if newest is None or newest > cutoff_ms:
                break
            out.append((mf.file_from_offset, mf.path, mf.wrote_position, newest))
        return out

    def _upload_ready(self) -> None:
        todo = self._candidates()
        for i, (from_offset, path, length, newest) in enumerate(todo):
            self.waiting_files = len(todo) - i
            if self._stop.is_set() or self._store.fenced:
                return
            self._upload(from_offset, path, length, newest)
        self.waiting_files = 0

    def _upload(self, from_offset: int, path: str, length: int, newest_ms: int) -> None:
        tier = self._tier
        key = tier.object_key(from_offset)
        began = time.monotonic()
        cfg = self._store.config
        building = self.workers.build_index(path, from_offset, length)
        try:
            uploading = self.workers.upload(
                tier.objects.endpoint, key, path, length, cfg.tier_upload_part_bytes, cfg.tier_upload_bytes_per_s
            )
            up = self.workers.result(uploading)
        finally:
            data = self.workers.result(building)
        head = file_index.parse_head(data)
        entry = TieredFile(from_offset, up.size, key, up.etag, newest_ms, head.topics, int(time.time() * 1000))
        if head.keys_at <= up.size:  # (always, but for a file of a record or two)
            tier.objects.put_bytes(tier.index_key(from_offset), data)
            entry = dataclasses.replace(
                entry, index_key=tier.index_key(from_offset), index_size=len(data), index_head=head.units_at,
                index_keys_at=head.keys_at, oldest_store_ms=head.oldest_ms,
            )  # fmt: skip
            tier.keep_head(entry, data[: head.units_at])
        took = time.monotonic() - began
        m = tier.manifest.copy()
        m.add(entry)
        tier.publish(m)
        self.uploaded_files += 1
        self.uploaded_bytes += up.size
        self.upload_seconds += took
        log.info(
            "tier: uploaded CommitLog file %020d (%d bytes, %d topics) in %.2f s (%.1f MB/s)",
            from_offset, up.size, len(head.topics), took, up.size / max(took, 1e-6) / 1e6,
        )  # fmt: skip

    def _apply_tier_retention(self) -> None:
        store, tier = self._store, self._tier
        now_ms = store.clock_ms()
        default_h = store.config.file_reserved_time_hours
        promised = store.topic_retention_hours
        m = tier.manifest
        n = 0
        for f in m.files:
            if not all(f.newest_store_ms < now_ms - promised.get(t, default_h) * HOUR_MS for t in f.topics):
                break  # in order: the tier stays one run of files
            n += 1
        if n == 0:
            return
        m = m.copy()
        gone = m.remove_first(n)
        tier.hide(gone)  # no reader is sent to an object about to go
        try:
            tier.publish(m)
        except BaseException:
            tier.unhide(gone)
            raise
        tier.objects.delete([f.key for f in gone] + [f.index_key for f in gone if f.index_key])
        for f in gone:
            tier.cache.forget(f.from_offset)
        tier.forget_indexes(gone)
        self.deleted_files += len(gone)
        log.info("tier retention deleted %d files; the tier now starts at %s", n, m.files[0].from_offset if m.files
                 else "the local log")  # fmt: skip
