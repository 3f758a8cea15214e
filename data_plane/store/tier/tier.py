"""A store's tier: the object store, the manifest readers see, the chunk cache and the
offloader, in one object (``MessageStore.tier``; None without ``tier_url``).

The manifest is replaced, never changed in place: ``publish`` writes the new one to the bucket,
then to the local copy (``<store>/tier/manifest.json``, which a start reads: no network on the way
up), then hands it to readers — so no reader is ever sent to an object the bucket does not hold.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from data_plane.store.config import parse_tier_url
from data_plane.store.tier.chunk_cache import ChunkCache
from data_plane.store.tier.manifest import Manifest, TieredFile
from data_plane.store.tier.object_store import ObjectStore, ObjectStoreError
from data_plane.store.tier.offload import Offloader

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)


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
        self.cache = ChunkCache(
            self.objects, self.find, self.after,
            chunk_bytes=cfg.tier_read_chunk_bytes, read_ahead=cfg.tier_read_ahead_chunks,
            memory_bytes=cfg.tier_cache_memory_bytes, directory=cfg.tier_cache_path,
            directory_bytes=cfg.tier_cache_dir_bytes,
        )  # fmt: skip
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
        if m.generation > self.manifest.generation or m.files != self.manifest.files:
            if m.generation < self.manifest.generation:
                log.warning("tier: the bucket's manifest (generation %d) is older than the local copy (%d): "
                            "taking the bucket's", m.generation, self.manifest.generation)  # fmt: skip
                m.generation = self.manifest.generation + 1
            m.save_local(self._state_dir)
            self.manifest = m

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
