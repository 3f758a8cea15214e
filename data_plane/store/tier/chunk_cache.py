"""Cold reads: the bytes of tiered CommitLog files, fetched by ranged GETs a chunk at a time
(``tier_read_chunk_bytes``, aligned within each file) and kept in two bounded caches — memory
(``tier_cache_memory_bytes``, least recently used first out) and a local directory
(``tier_cache_dir_bytes``, likewise). A fetch also starts the next ``tier_read_ahead_chunks``
chunks in the background, and a reader's first view of a chunk fetched ahead moves that window
on (it starts what has come into range), so a sequential reader keeps ``tier_read_ahead_chunks``
GETs under way and finds its chunks fetched: not a wait for a GET every ``1 + read_ahead``
chunks, as when only a miss starts the read-ahead.

``view`` is the readers' side and never blocks: bytes from memory, or None. ``fetch`` (a
worker thread's) brings a chunk into memory, from the directory or the object store; several
callers wanting one chunk share one GET.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from data_plane.store.tier.manifest import TieredFile
from data_plane.store.tier.object_store import ObjectStore

log = logging.getLogger(__name__)

ChunkKey = tuple[int, int]  # (file's from offset, chunk number in the file)


class ChunkCache:
    def __init__(
        self,
        objects: ObjectStore,
        find: Callable[[int], TieredFile | None],
        after: Callable[[TieredFile], TieredFile | None],
        *,
        chunk_bytes: int,
        read_ahead: int,
        memory_bytes: int,
        directory: str,
        directory_bytes: int,
    ) -> None:
        self._objects = objects
        self._find = find  # the manifest's lookups: the file holding an offset, the file after one
        self._after = after
        self.chunk_bytes = chunk_bytes
        self.read_ahead = read_ahead
        self.memory_bytes = memory_bytes
        self.directory = directory
        self.directory_bytes = directory_bytes
        self._lock = threading.Lock()
        self._memory: OrderedDict[ChunkKey, bytes] = OrderedDict()
        self._memory_used = 0
        self._on_disk: OrderedDict[ChunkKey, int] = OrderedDict()
        self._disk_used = 0
        self._inflight: dict[ChunkKey, concurrent.futures.Future[bytes]] = {}
        # Chunks fetched ahead that no reader has viewed yet: the first view moves the window on.
        self._ahead: set[ChunkKey] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tier-read")
        # Counters (the broker's runtime info).
        self.gets = 0
        self.get_bytes = 0
        self.memory_hits = 0
        self.disk_hits = 0
        if directory_bytes > 0:
            self._load_directory()

    # --- the readers' side (any thread; never blocks on I/O) -------------------------------------
    def view(self, offset: int, size: int) -> memoryview | None:
        """``size`` bytes at CommitLog ``offset`` if every chunk they lie in is in memory."""
        f = self._find(offset)
        if f is None or offset + size > f.from_offset + f.size:
            return None
        pos = offset - f.from_offset
        c = self.chunk_bytes
        first, last = pos // c, (pos + size - 1) // c
        with self._lock:
            mem = self._memory
            a = mem.get((f.from_offset, first))
            if a is None:
                return None
            mem.move_to_end((f.from_offset, first))
            if self._ahead and (f.from_offset, first) in self._ahead:
                self._ahead.discard((f.from_offset, first))
                self._read_ahead_locked(f, first + 1)  # (submits only: never waits)
            if first == last:
                at = pos - first * c
                return memoryview(a)[at : at + size]
            pieces = [memoryview(a)[pos - first * c :]]
            for k in range(first + 1, last + 1):
                b = mem.get((f.from_offset, k))
                if b is None:
                    return None
                mem.move_to_end((f.from_offset, k))
                pieces.append(memoryview(b))
        joined = b"".join(pieces)  # a record across chunks: the one copy a cold read makes
        return memoryview(joined)[:size]

    def _chunks(self, offset: int, size: int) -> tuple[TieredFile, int, int] | None:
        """The tiered file holding ``offset..offset+size`` and its first and last chunk numbers."""
        f = self._find(offset)
        if f is None:
            return None
        pos = offset - f.from_offset
        end = min(pos + max(size, 1), f.size)
        return f, pos // self.chunk_bytes, (end - 1) // self.chunk_bytes

    def missing(self, offset: int, size: int) -> ChunkKey | None:
        """The first chunk of ``offset..offset+size`` not in memory (None: all are, or the bytes are
        not tiered)."""
        found = self._chunks(offset, size)
        if found is None:
            return None
        f, first, last = found
        with self._lock:
            for k in range(first, last + 1):
                if (f.from_offset, k) not in self._memory:
                    return f.from_offset, k
        return None

    # --- fetching (blocking: worker threads) -----------------------------------------------------
    def fetch(self, offset: int, size: int = 1) -> bool:
        """Bring the chunks holding ``offset..offset+size`` into memory, and start the read-ahead
        after them. False when the bytes are not tiered. Raises ObjectStoreError."""
        found = self._chunks(offset, size)
        if found is None:
            return False
        f, first, last = found
        for k in range(first, last + 1):
            self._fetch_chunk(f, k).result()
        with self._lock:
            self._read_ahead_locked(f, last + 1)
        return True

    def _read_ahead_locked(self, f: TieredFile | None, k: int) -> None:
        """Start the ``read_ahead`` chunks from chunk ``k`` of ``f`` that are neither in memory nor
        under way, into the next file when this one ends (the lock held; nothing waits)."""
        c = self.chunk_bytes
        for _ in range(self.read_ahead):
            if f is not None and k * c >= f.size:
                f, k = self._after(f), 0
            if f is None:
                return
            key = (f.from_offset, k)
            if key not in self._memory and key not in self._inflight:
                try:
                    self._inflight[key] = self._pool.submit(self._load, f, k, ahead=True)
                except RuntimeError:  # closed: the store is stopping
                    return
            k += 1

    def _fetch_chunk(self, f: TieredFile, k: int) -> concurrent.futures.Future[bytes]:
        key = (f.from_offset, k)
        with self._lock:
            data = self._memory.get(key)
            if data is not None:
                self.memory_hits += 1
                done: concurrent.futures.Future[bytes] = concurrent.futures.Future()
                done.set_result(data)
                return done
            fut = self._inflight.get(key)
            if fut is not None:
                return fut
            fut = self._pool.submit(self._load, f, k)
            self._inflight[key] = fut
        return fut

    def _load(self, f: TieredFile, k: int, *, ahead: bool = False) -> bytes:
        key = (f.from_offset, k)
        try:
            data = self._read_disk(key)
            if data is None:
                start = k * self.chunk_bytes
                data = self._objects.get_range(f.key, start, min(self.chunk_bytes, f.size - start))
                with self._lock:
                    self.gets += 1
                    self.get_bytes += len(data)
                self._write_disk(key, data)
            else:
                with self._lock:
                    self.disk_hits += 1
            with self._lock:
                old = self._memory.pop(key, None)
                if old is not None:
                    self._memory_used -= len(old)
                self._memory[key] = data
                self._memory_used += len(data)
                if ahead:
                    self._ahead.add(key)
                while self._memory_used > self.memory_bytes and len(self._memory) > 1:
                    gone_key, gone = self._memory.popitem(last=False)
                    self._memory_used -= len(gone)
                    self._ahead.discard(gone_key)
            return data
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    # --- the directory -----------------------------------------------------------------------------
    def _path(self, key: ChunkKey) -> str:
        return os.path.join(self.directory, f"{key[0]:020d}.{key[1]:06d}")

    def _load_directory(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        found = []
        for name in os.listdir(self.directory):
            a, _, b = name.partition(".")
            path = os.path.join(self.directory, name)
            if not (a.isdigit() and b.isdigit() and len(a) == 20 and len(b) == 6):
                if name.endswith(".tmp"):
                    os.unlink(path)  # a write a crash cut short
                continue
            st = os.stat(path)
            found.append((st.st_mtime, (int(a), int(b)), st.st_size))
        for _, key, size in sorted(found):
            self._on_disk[key] = size
            self._disk_used += size
        self._trim_disk()

    def _read_disk(self, key: ChunkKey) -> bytes | None:
        if self.directory_bytes <= 0:
            return None
        with self._lock:
            if key not in self._on_disk:
                return None
            self._on_disk.move_to_end(key)
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except OSError:
            with self._lock:
                self._disk_used -= self._on_disk.pop(key, 0)
            return None

    def _write_disk(self, key: ChunkKey, data: bytes) -> None:
        if self.directory_bytes <= 0 or len(data) > self.directory_bytes:
            return
        path = self._path(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(path + ".tmp", "wb") as fh:
                fh.write(data)
            os.replace(path + ".tmp", path)
        except OSError as e:  # a cache: a full disk costs a GET later, nothing else
            log.info("tier cache: cannot keep chunk %s on disk: %s", key, e)
            return
        with self._lock:
            self._disk_used += len(data) - self._on_disk.pop(key, 0)
            self._on_disk[key] = len(data)
        self._trim_disk()

    def _trim_disk(self) -> None:
        while True:
            with self._lock:
                if self._disk_used <= self.directory_bytes or not self._on_disk:
                    return
                key, size = self._on_disk.popitem(last=False)
                self._disk_used -= size
            with contextlib.suppress(OSError):
                os.unlink(self._path(key))

    def forget(self, from_offset: int) -> None:
        """Drop a file's chunks (its object was deleted by tier retention)."""
        with self._lock:
            for key in [k for k in self._memory if k[0] == from_offset]:
                self._memory_used -= len(self._memory.pop(key))
                self._ahead.discard(key)
            disk = [k for k in self._on_disk if k[0] == from_offset]
            for key in disk:
                self._disk_used -= self._on_disk.pop(key)
        for key in disk:
            with contextlib.suppress(OSError):
                os.unlink(self._path(key))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "gets": self.gets, "getBytes": self.get_bytes, "memoryHits": self.memory_hits,
                "diskHits": self.disk_hits, "memoryBytes": self._memory_used, "diskBytes": self._disk_used,
            }  # fmt: skip

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
