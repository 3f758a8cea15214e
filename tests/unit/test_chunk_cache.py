"""The tier's chunk cache (data_plane/store/tier/chunk_cache.py) over an object store in memory:
no network, no directory."""

from __future__ import annotations

import threading
import time
from typing import cast

import pytest

from data_plane.store.tier.chunk_cache import ChunkCache
from data_plane.store.tier.manifest import Manifest, TieredFile
from data_plane.store.tier.object_store import ObjectStore

pytestmark = pytest.mark.unit

CHUNK = 1024
CHUNKS_A_FILE = 8
RECORD = 100
WAIT_S = 5.0


class InMemoryObjects:
    """``get_range`` of ObjectStore over a dict; remembers every GET."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._lock:
            self.gets.append((key, start))
        return self.objects[key][start : start + length]


def two_files() -> tuple[InMemoryObjects, Manifest]:
    size = CHUNK * CHUNKS_A_FILE
    data = {"a": bytes(i % 251 for i in range(size)), "b": bytes(i % 241 for i in range(size))}
    files = [TieredFile(0, size, "a", "", 0, ("t",), 0), TieredFile(size, size, "b", "", 0, ("t",), 0)]
    return InMemoryObjects(data), Manifest("g", files)


def test_a_sequential_reader_keeps_the_read_ahead_going_without_another_fetch() -> None:
    objects, manifest = two_files()
    cache = ChunkCache(
        cast(ObjectStore, objects), manifest.find, manifest.after,
        chunk_bytes=CHUNK, read_ahead=2, memory_bytes=1 << 20, directory="", directory_bytes=0,
    )  # fmt: skip
    try:
        assert cache.fetch(0, RECORD)  # the one fetch: chunk 0, and chunks 1-2 ahead
        size = CHUNK * CHUNKS_A_FILE
        for offset in range(0, 2 * size - RECORD, RECORD):
            if offset // size != (offset + RECORD - 1) // size:
                continue  # a record never spans two files
            deadline = time.monotonic() + WAIT_S
            while (view := cache.view(offset, RECORD)) is None:  # only the read-ahead can bring it
                assert time.monotonic() < deadline, f"chunk {offset // CHUNK} was never fetched ahead"
                time.sleep(0.001)
            f = manifest.find(offset)
            assert f is not None
            at = offset - f.from_offset
            assert bytes(view) == objects.objects[f.key][at : at + RECORD]
        assert sorted(objects.gets) == [(k, n * CHUNK) for k in ("a", "b") for n in range(CHUNKS_A_FILE)]
    finally:
        cache.close()
