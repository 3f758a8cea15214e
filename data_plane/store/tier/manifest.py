"""A broker group's manifest: which CommitLog files its object store holds, one JSON object
(``<prefix>/<group>/manifest.json``) written by the group's master after every verified upload
and every tier deletion. A file is in the manifest only once its object was checked (size and
ETag); an object no manifest names is an upload that did not finish, and is overwritten.

Each entry keeps what readers and retention need without opening the object: where the file
starts in the CommitLog, how many bytes it holds, when its oldest and newest messages were
stored, the topics with messages in it (tier retention is per topic: a file goes when every
topic in it is past its own retention), and where its index object is (``file_index``).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from dataclasses import dataclass, field

import orjson

MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class TieredFile:
    from_offset: int  # the CommitLog offset of the file's first byte (its file name)
    size: int  # bytes uploaded: the file up to where its records end
    key: str
    etag: str
    newest_store_ms: int  # no message of the file was stored later
    topics: tuple[str, ...]
    uploaded_ms: int
    # The file's index object (``file_index``; empty key: none, its ConsumeQueue units and index
    # entries stay local): its key, its length, where its head ends and where its key table starts.
    index_key: str = ""
    index_size: int = 0
    index_head: int = 0
    index_keys_at: int = 0
    oldest_store_ms: int = 0  # no message of the file was stored earlier

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {
            "from": self.from_offset, "size": self.size, "key": self.key, "etag": self.etag,
            "newest_ms": self.newest_store_ms, "topics": list(self.topics), "uploaded_ms": self.uploaded_ms,
        }  # fmt: skip
        if self.index_key:
            d["index"] = {"key": self.index_key, "size": self.index_size, "head": self.index_head,
                          "keys_at": self.index_keys_at}  # fmt: skip
            d["oldest_ms"] = self.oldest_store_ms
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> TieredFile:
        def num(name: str) -> int:
            v = d.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"manifest entry: {name} must be a non-negative integer")
            return v

        key, etag, topics = d.get("key"), d.get("etag"), d.get("topics")
        if not isinstance(key, str) or not isinstance(etag, str):
            raise ValueError("manifest entry: key and etag must be strings")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise ValueError("manifest entry: topics must be a list of names")
        f = cls(num("from"), num("size"), key, etag, num("newest_ms"), tuple(topics), num("uploaded_ms"))
        index = d.get("index")
        if index is None:
            return f
        if not isinstance(index, dict) or not isinstance(index.get("key"), str) or not index["key"]:
            raise ValueError("manifest entry: index must name its object")
        sizes = [v for v in (index.get(k) for k in ("size", "head", "keys_at")) if type(v) is int]
        if len(sizes) != 3:
            raise ValueError("manifest entry: index size, head and keys_at must be integers")
        size, head, keys_at = sizes
        if not 0 < head <= keys_at <= size or keys_at > f.size:
            raise ValueError(f"manifest entry: index lengths out of order ({head}, {keys_at}, {size})")
        return dataclasses.replace(
            f, index_key=index["key"], index_size=size, index_head=head, index_keys_at=keys_at,
            oldest_store_ms=num("oldest_ms"),
        )  # fmt: skip


@dataclass
class Manifest:
    group: str
    files: list[TieredFile] = field(default_factory=list)  # by from_offset, no two alike
    # Bumped by every write: a reader that holds a newer one never goes back to an older one.
    generation: int = 0

    def __post_init__(self) -> None:
        self._starts = [f.from_offset for f in self.files]

    def _reindex(self) -> None:
        self.files.sort(key=lambda f: f.from_offset)
        self._starts = [f.from_offset for f in self.files]

    def find(self, offset: int) -> TieredFile | None:
        """The tiered file holding CommitLog ``offset``, or None."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0:
            f = self.files[i]
            if f.from_offset <= offset < f.from_offset + f.size:
                return f
        return None

    def after(self, f: TieredFile) -> TieredFile | None:
        """The tiered file after ``f``, or None."""
        i = bisect.bisect_right(self._starts, f.from_offset)
        return self.files[i] if i < len(self.files) else None

    def copy(self) -> Manifest:
        """A copy to change and publish (readers keep the one they hold), one generation on."""
        return Manifest(self.group, list(self.files), self.generation + 1)

    def has(self, from_offset: int) -> bool:
        i = bisect.bisect_left(self._starts, from_offset)
        return i < len(self._starts) and self._starts[i] == from_offset

    def add(self, f: TieredFile) -> None:
        self.files = [x for x in self.files if x.from_offset != f.from_offset] + [f]
        self._reindex()

    def remove_first(self, n: int) -> list[TieredFile]:
        gone, self.files = self.files[:n], self.files[n:]
        self._reindex()
        return gone

    def floor(self, local_min: int, file_size: int) -> int:
        """The lowest offset from which the tier and the local log together hold every byte up
        to the local log's start: the first tiered file of the run that ends where the local
        log begins (``local_min`` when there is none)."""
        floor = local_min
        i = bisect.bisect_left(self._starts, local_min) - 1
        while i >= 0 and self.files[i].from_offset + file_size == floor:
            floor = self.files[i].from_offset
            i -= 1
        return floor

    def tiered_bytes(self) -> int:
        return sum(f.size for f in self.files)

    # --- encoding ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        doc = {
            "version": MANIFEST_VERSION,
            "group": self.group,
            "generation": self.generation,
            "files": [f.to_json() for f in self.files],
        }
        return orjson.dumps(doc)

    @classmethod
    def from_bytes(cls, data: bytes, group: str) -> Manifest:
        try:
            doc = orjson.loads(data)
        except ValueError as e:
            raise ValueError(f"manifest is not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest: unknown version {doc.get('version') if isinstance(doc, dict) else None!r}")
        if doc.get("group") != group:
            raise ValueError(f"manifest belongs to group {doc.get('group')!r}, not {group!r}")
        files = doc.get("files")
        generation = doc.get("generation")
        if not isinstance(files, list) or not isinstance(generation, int):
            raise ValueError("manifest: files must be a list and generation an integer")
        m = cls(group, [TieredFile.from_json(f) for f in files], generation)
        m._reindex()
        return m

    # --- the local copy ------------------------------------------------------------------------
    def save_local(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "manifest.json")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def load_local(cls, directory: str, group: str) -> Manifest:
        try:
            with open(os.path.join(directory, "manifest.json"), "rb") as f:
                return cls.from_bytes(f.read(), group)
        except FileNotFoundError:
            return cls(group)
