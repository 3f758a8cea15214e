"""A store's tier: the object store, the manifest readers see, the chunk cache and the
offloader, in one object (``MessageStore.tier``; None without ``tier_url``).

The manifest is replaced, never changed in place: ``publish`` writes the new one to the bucket,
then to the local copy (``<store>/tier/manifest.json``, which a start reads: no network on the way
up), then hands it to readers — so no reader is ever sent to an object the bucket does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from typing import TYPE_CHECKING

from data_plane.store.config import parse_tier_url
from data_plane.store.index_file import key_hash
from data_plane.store.tier import file_index
from data_plane.store.tier.chunk_cache import ChunkCache
from data_plane.store.tier.file_index import UNIT_SIZE, IndexHead
from data_plane.store.tier.manifest import Manifest, TieredFile
from data_plane.store.tier.object_store import ObjectStore, ObjectStoreError
from data_plane.store.tier.offload import Offloader
from data_plane.store.tier.queue_ranges import Located, TieredQueues

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)

INDEX_CHUNK_BYTES = 256 * 1024  # one ranged GET of an index object's units (12,000 units)


class Tier:
    def __init__(self, store: MessageStore) -> None:
        cfg = store.config
        bucket, prefix = parse_tier_url(cfg.tier_url)
        self.base = f"{prefix}/{cfg.tier_group}/" if prefix else f"{cfg.tier_group}/"
        self.file_size = cfg.commit_log_file_size_bytes
        self._state_dir = cfg.tier_state_path
        self.objects = ObjectStore(
            bucket, endpoint_url=cfg.tier_endpoint_url, region=cfg.tier_region, profile=cfg.tier_profile,
            timeout_s=cfg.tier_request_timeout_ms / 1000,
        )  # fmt: skip
        self.manifest = Manifest.load_local(self._state_dir, cfg.tier_group)
        # The caches' bounds are shared: an eighth (at least a chunk) for the indexes' units.
        index_chunk = min(INDEX_CHUNK_BYTES, cfg.tier_read_chunk_bytes)
        index_memory = max(index_chunk, cfg.tier_cache_memory_bytes // 8)
        index_disk = max(index_chunk, cfg.tier_cache_dir_bytes // 8) if cfg.tier_cache_dir_bytes else 0
        self.cache = ChunkCache(
            self.objects, self.find, self.after,
            chunk_bytes=cfg.tier_read_chunk_bytes, read_ahead=cfg.tier_read_ahead_chunks,
            memory_bytes=cfg.tier_cache_memory_bytes - index_memory, directory=cfg.tier_cache_path,
            directory_bytes=max(0, cfg.tier_cache_dir_bytes - index_disk),
        )  # fmt: skip
        # The index objects' heads and units: the heads of every indexed file, by queue (kept
        # locally too, under <store>/tier/index/: no network on the way up), and their units
        # through a cache of their own, addressed at the indexed file's CommitLog offsets.
        self.queues = TieredQueues()
        self._heads_dir = os.path.join(self._state_dir, "index")
        # The parsed heads by file, for key queries (their ranges are the ones ``queues`` holds).
        self._heads: dict[int, IndexHead] = {}
        self.index_cache = ChunkCache(
            self.objects, self._find_index, self._after_index,
            chunk_bytes=index_chunk, read_ahead=2, memory_bytes=index_memory,
            directory=os.path.join(cfg.tier_cache_path, "index"), directory_bytes=index_disk,
        )  # fmt: skip
        self._load_heads()
        self.offloader = Offloader(store, self)

    # --- where things are ------------------------------------------------------------------------
    def object_key(self, from_offset: int) -> str:
        return f"{self.base}commitlog/{from_offset:020d}"

    @property
    def manifest_key(self) -> str:
        return f"{self.base}manifest.json"

    def find(self, offset: int) -> TieredFile | None:
        return self.manifest.find(offset)

    def after(self, f: TieredFile) -> TieredFile | None:
        return self.manifest.after(f)

    def floor(self, local_min: int) -> int:
        """Where the tier and the local log together begin (see ``Manifest.floor``)."""
        return self.manifest.floor(local_min, self.file_size)

    def covers(self, offset: int) -> bool:
        return self.manifest.find(offset) is not None

    def index_key(self, from_offset: int) -> str:
        return f"{self.base}index/{from_offset:020d}"

    def units_floor(self, local_min: int) -> int:
        """Below which offset the tier's indexes hold every ConsumeQueue unit and index entry (the
        local queues and IndexFiles need not): ``local_min`` when every tiered file below it has
        an index whose head this store holds, else the start of the lowest one that has not."""
        floor = local_min
        for f in self.manifest.files:
            if f.from_offset >= local_min:
                break
            if not f.index_key or not self.queues.has(f.from_offset):
                floor = min(floor, f.from_offset)
        return floor

    # --- the indexes ---------------------------------------------------------------------------
    def _find_index(self, offset: int) -> TieredFile | None:
        f = self.manifest.find(offset)
        if f is None or not f.index_key or offset >= f.from_offset + f.index_keys_at:
            return None
        return TieredFile(f.from_offset, f.index_keys_at, f.index_key, "", 0, (), 0)

    def _after_index(self, f: TieredFile) -> TieredFile | None:
        nxt = self.manifest.find(f.from_offset)
        nxt = self.manifest.after(nxt) if nxt is not None else None
        return self._find_index(nxt.from_offset) if nxt is not None else None

    def units(self, topic: str, queue_id: int, offset: int, max_units: int) -> tuple[memoryview, int] | int | None:
        """Up to ``max_units`` tiered units of a queue from ``offset`` if they are in memory
        (never blocks): ``(units, count)``; a negative int ``-1 - address`` when they are not
        (``load_units(address)`` brings them); None when the tier has no such unit (``gap``
        tells where the next ones begin)."""
        at = self.queues.find(topic, queue_id, offset)
        if not isinstance(at, Located):
            return None
        addr = at.file_from + at.units_at
        c = self.index_cache.chunk_bytes
        in_chunk = (c - (at.units_at % c)) // UNIT_SIZE  # (a unit across two chunks: one at a time)
        n = max(1, min(max_units, at.count, in_chunk))
        view = self.index_cache.view(addr, n * UNIT_SIZE)
        if view is None:
            return -1 - addr
        return view, n

    def gap(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Where the queue's tiered units go on after ``offset`` when the tier has none there."""
        at = self.queues.find(topic, queue_id, offset)
        return at if isinstance(at, int) else None

    async def load_units(self, address: int) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.index_cache.fetch, address, UNIT_SIZE)

    def keyed_offsets(self, topic: str, key: str, begin_ms: int, end_ms: int, below: int, want: int) -> list[int]:
        """Up to about ``want`` CommitLog offsets indexed under ``topic#key`` in the tiered files that
        start below ``below`` and hold messages of the time range, newest first (worker threads:
        two ranged GETs a file whose key table may hold the key)."""
        h = key_hash(f"{topic}#{key}")
        out: list[int] = []
        for f in reversed(self.manifest.files):
            if len(out) >= want:
                break
            if f.from_offset >= below or not f.index_key or topic not in f.topics:
                continue
            if f.newest_store_ms < begin_ms or f.oldest_store_ms > end_ms:
                continue
            head = self._heads.get(f.from_offset) or self._head(f)
            block = head.key_block(h) if head is not None else None
            if head is None or block is None:
                continue
            first, last = block
            hashes = self.objects.get_range(f.index_key, file_index.hashes_at(head, first), 4 * (last - first))
            i, j = file_index.matching(hashes, h)
            if i == j:
                continue
            raw = self.objects.get_range(f.index_key, file_index.offsets_at(head, first + i), 8 * (j - i))
            out.extend(reversed(struct.unpack(f"<{j - i}q", raw)))
        return out

    def _head(self, f: TieredFile) -> IndexHead | None:
        """The file's head as kept locally (None: not kept, or damaged)."""
        try:
            with open(os.path.join(self._heads_dir, f"{f.from_offset:020d}"), "rb") as fh:
                head = file_index.parse_head(fh.read())
        except (OSError, file_index.IndexObjectError):
            return None
        self._heads[f.from_offset] = head
        return head

    def keep_head(self, f: TieredFile, head_bytes: bytes) -> IndexHead:
        """Check an index head, keep it locally and take its queue ranges."""
        head = file_index.parse_head(head_bytes)
        if head.from_offset != f.from_offset or head.units_at != f.index_head:
            raise file_index.IndexObjectError(f"the index head of {f.from_offset} does not match the manifest")
        os.makedirs(self._heads_dir, exist_ok=True)
        path = os.path.join(self._heads_dir, f"{f.from_offset:020d}")
        with open(path + ".tmp", "wb") as fh:
            fh.write(head_bytes)
        os.replace(path + ".tmp", path)
        self._heads[f.from_offset] = head
        self.queues.add(head)
        return head

    def _load_heads(self) -> None:
        """The heads kept locally, of the files the manifest names (at start: no network)."""
        for f in self.manifest.files:
            if f.index_key:
                head = self._head(f)
                if head is not None:
                    self.queues.add(head)

    def fetch_missing_heads(self, m: Manifest) -> None:
        """The heads of ``m``'s indexed files this store does not hold (a slave's, or a new
        master's, from the bucket; the offloader's thread)."""
        for f in m.files:
            if f.index_key and not self.queues.has(f.from_offset):
                try:
                    self.keep_head(f, self.objects.get_range(f.index_key, 0, f.index_head))
                except file_index.IndexObjectError as e:
                    log.warning("tier: the index of %020d cannot be used (its units stay local): %s", f.from_offset, e)

    def hide(self, gone: list[TieredFile]) -> None:
        """Readers stop finding ``gone``'s messages (their queue ranges go) before the manifest
        without them is published: a reader is never sent to a file about to go."""
        self.queues.drop({f.from_offset for f in gone})

    def unhide(self, kept: list[TieredFile]) -> None:
        """Undo ``hide`` when the manifest without them could not be published."""
        for f in kept:
            head = self._heads.get(f.from_offset) or self._head(f)
            if head is not None:
                self.queues.add(head)

    def forget_indexes(self, gone: list[TieredFile]) -> None:
        self.queues.drop({f.from_offset for f in gone})
        for f in gone:
            self._heads.pop(f.from_offset, None)
            self.index_cache.forget(f.from_offset)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._heads_dir, f"{f.from_offset:020d}"))

    # --- reading ---------------------------------------------------------------------------------
    def view(self, offset: int, size: int) -> memoryview | None:
        """The bytes if they are in memory now (never blocks)."""
        return self.cache.view(offset, size)

    def missing(self, offset: int, size: int) -> bool:
        return self.cache.missing(offset, size) is not None

    async def load(self, offset: int, size: int = 1) -> bool:
        """Fetch the chunks holding ``offset..offset+size`` (and read ahead) on a worker thread.
        False when the bytes are not tiered; raises ObjectStoreError."""
        return await asyncio.get_running_loop().run_in_executor(None, self.cache.fetch, offset, size)

    def read_blocking(self, offset: int, size: int) -> memoryview | None:
        """The bytes, fetched if need be (worker threads only)."""
        if not self.cache.fetch(offset, size):
            return None
        return self.cache.view(offset, size)

    # --- the manifest ----------------------------------------------------------------------------
    def publish(self, m: Manifest) -> None:
        """Write ``m`` to the bucket, then the local copy, then give it to readers."""
        self.objects.put_bytes(self.manifest_key, m.to_bytes())
        m.save_local(self._state_dir)
        self.manifest = m

    def refresh(self) -> None:
        """Take the bucket's manifest when it is newer than the one held (a slave learns what
        its master uploaded; a new master where its predecessor stopped)."""
        data = self.objects.get_bytes(self.manifest_key)
        if data is None:
            return
        try:
            m = Manifest.from_bytes(data, self.manifest.group)
        except ValueError as e:
            raise ObjectStoreError(f"s3 manifest {self.manifest_key}: {e}") from e
        self.fetch_missing_heads(m)
        if m.generation > self.manifest.generation or m.files != self.manifest.files:
            gone = [f for f in self.manifest.files if not m.has(f.from_offset)]
            if m.generation < self.manifest.generation:
                log.warning("tier: the bucket's manifest (generation %d) is older than the local copy (%d): "
                            "taking the bucket's", m.generation, self.manifest.generation)  # fmt: skip
                m.generation = self.manifest.generation + 1
            self.hide(gone)
            m.save_local(self._state_dir)
            self.manifest = m
            self.forget_indexes(gone)

    def abort_stale_uploads(self) -> None:
        """Multipart uploads a crash left behind (a new tenure starts each file afresh)."""
        for key, upload_id in self.objects.stale_uploads(self.base):
            log.info("tier: aborting an unfinished upload of %s", key)
            self.objects.abort_upload(key, upload_id)

    # --- figures ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        m = self.manifest
        o = self.offloader
        return {
            "tieredFiles": len(m.files),
            "tieredBytes": m.tiered_bytes(),
            "tierFromOffset": m.files[0].from_offset if m.files else -1,
            "uploadedFiles": o.uploaded_files,
            "uploadedBytes": o.uploaded_bytes,
            "uploadSeconds": round(o.upload_seconds, 3),
            "waitingFiles": o.waiting_files,
            "tierDeletedFiles": o.deleted_files,
            "tierError": o.last_error,
            **self.cache.stats(),
        }

    def start(self) -> None:
        self.offloader.start()

    def close(self) -> None:
        self.offloader.stop()
        self.cache.close()
        self.index_cache.close()
