"""HPACK (RFC 7541): the header compression HTTP/2 uses.

The decoder keeps the peer's dynamic table, bounded by the table size this side advertised;
it reads every representation (indexed, literal with and without indexing, never indexed, table
size update) and Huffman-coded strings. A decoded header list larger than the limit still updates
the table (the peer's next block depends on it) and is then refused with ``HeaderListTooLarge``.

The encoder writes only literals without indexing and static-table references, so this side
keeps no table the peer must mirror, and what it writes is cheap to precompute.
"""

from __future__ import annotations

from typing import Final

from data_plane.http2.huffman import HuffmanError
from data_plane.http2.huffman import decode as huffman_decode

__all__ = ["STATIC_TABLE", "Decoder", "HeaderListTooLarge", "HpackError", "encode_int", "encode_literal"]

# RFC 7541 Appendix A: index 1 is the first entry.
STATIC_TABLE: Final[tuple[tuple[str, str], ...]] = (
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
)
assert len(STATIC_TABLE) == 61
STATIC_SIZE: Final = len(STATIC_TABLE)
ENTRY_OVERHEAD: Final = 32  # RFC 7541 section 4.1
MAX_STRING: Final = 1 << 16  # no single name or value is longer (the header list bound is smaller still)
CACHE_ENTRIES: Final = 512
MAX_CACHED_BLOCK: Final = 2048


class HpackError(ValueError):
    """A header block that cannot be decoded: the connection ends with COMPRESSION_ERROR."""


class HeaderListTooLarge(Exception):
    """A decoded header list above the limit (the table is up to date; the request is refused)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the header list is {size} bytes; at most {limit} are taken")
        self.size = size
        self.limit = limit


class Decoder:
    """The peer's dynamic table and the decoding of its header blocks, one after another."""

    __slots__ = ("_blocks", "_cache", "_entries", "_generation", "_size", "max_list_size", "max_size", "table_limit")

    def __init__(self, *, table_limit: int = 4096, max_list_size: int = 16 * 1024) -> None:
        self.table_limit = table_limit  # what this side advertised (SETTINGS_HEADER_TABLE_SIZE)
        self.max_size = table_limit  # what the peer chose, at most the limit
        self.max_list_size = max_list_size
        self._entries: list[tuple[str, str]] = []  # oldest first
        self._size = 0
        # Strings seen before, decoded: a client repeats most of its values (content-type, the
        # user agent, its namespace and client id) until its table learns them.
        self._cache: dict[bytes, str] = {}
        # Whole blocks that changed nothing in the table, decoded, with the table's generation
        # they were decoded under (it counts the table's changes): the same bytes under the same
        # table are the same list. A client sending the same headers each call pays a lookup.
        self._blocks: dict[bytes, tuple[int, int, tuple[tuple[str, str], ...]]] = {}
        self._generation = 0

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        hit = self._blocks.get(block)
        if hit is not None and hit[0] == self._generation:
            if hit[1] > self.max_list_size:
                raise HeaderListTooLarge(hit[1], self.max_list_size)
            return list(hit[2])
        generation = self._generation
        out: list[tuple[str, str]] = []
        n = len(block)
        pos = 0
        list_size = 0
        while pos < n:
            b = block[pos]
            if b & 0x80:  # indexed field
                index, pos = _int(block, pos, 7)
                name, value = self._at(index)
            elif b & 0x40:  # literal with incremental indexing
                name, value, pos = self._literal(block, pos, 6)
                self._insert(name, value)
            elif b & 0x20:  # dynamic table size update
                if out:
                    raise HpackError("a table size update after the first field of a block")
                size, pos = _int(block, pos, 5)
                if size > self.table_limit:
                    raise HpackError(f"a table size update to {size}, above the {self.table_limit} allowed")
                self.max_size = size
                self._generation += 1
                self._evict(0)
                continue
            else:  # literal without indexing (0000) or never indexed (0001)
                name, value, pos = self._literal(block, pos, 4)
            out.append((name, value))
            list_size += len(name) + len(value) + ENTRY_OVERHEAD
        if list_size > self.max_list_size:
            raise HeaderListTooLarge(list_size, self.max_list_size)
        if self._generation == generation and n <= MAX_CACHED_BLOCK:
            if len(self._blocks) >= CACHE_ENTRIES:
                self._blocks.clear()
            self._blocks[block] = (generation, list_size, tuple(out))
        return out

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[str, str, int]:
        """A literal field's name (indexed or new) and value; (name, value, next pos)."""
        index, pos = _int(block, pos, prefix)
        if index:
            name = self._at(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return name, value, pos

    def _at(self, index: int) -> tuple[str, str]:
        if 0 < index <= STATIC_SIZE:
            return STATIC_TABLE[index - 1]
        d = index - STATIC_SIZE
        if index == 0 or d > len(self._entries):
            raise HpackError(f"index {index} is not in the header table")
        return self._entries[-d]

    def _insert(self, name: str, value: str) -> None:
        self._generation += 1
        size = len(name) + len(value) + ENTRY_OVERHEAD
        if size > self.max_size:  # RFC 7541 section 4.4: the table empties, the entry is not kept
            self._entries.clear()
            self._size = 0
            return
        self._evict(size)
        self._entries.append((name, value))
        self._size += size

    def _evict(self, room: int) -> None:
        entries = self._entries
        drop = 0
        while self._size + room > self.max_size and drop < len(entries):
            name, value = entries[drop]
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD
            drop += 1
        if drop:
            del entries[:drop]

    def _string(self, block: bytes, pos: int) -> tuple[str, int]:
        if pos >= len(block):
            raise HpackError("a header block ends where a string should start")
        huffman = block[pos] & 0x80
        length, pos = _int(block, pos, 7)
        end = pos + length
        if length > MAX_STRING or end > len(block):
            raise HpackError("a header string runs past its block")
        raw = block[pos:end]
        if not huffman:
            return raw.decode("latin-1"), end
        text = self._cache.get(raw)
        if text is None:
            try:
                text = huffman_decode(raw).decode("latin-1")
            except HuffmanError as e:
                raise HpackError(str(e)) from None
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[raw] = text
        return text, end


def _int(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """An integer with an N-bit prefix (RFC 7541 section 5.1) at ``pos``; (value, next pos)."""
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    n = len(block)
    while True:
        if pos >= n:
            raise HpackError("a header block ends inside an integer")
        b = block[pos]
        pos += 1
        value += (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HpackError("an integer in a header block is too large")


def encode_int(value: int, prefix: int, first: int = 0) -> bytes:
    """``value`` with an N-bit prefix; ``first`` holds the representation's leading bits."""
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((first | value,))
    out = bytearray((first | mask,))
    value -= mask
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_literal(name: bytes, value: bytes) -> bytes:
    """A literal field without indexing, its name a new name, neither string Huffman-coded."""
    return b"\x00" + encode_int(len(name), 7) + name + encode_int(len(value), 7) + value


def encode_indexed(index: int) -> bytes:
    """A field of the static table, by its index."""
    return encode_int(index, 7, 0x80)


def encode_literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal field without indexing whose name is the static table's entry ``index``."""
    return encode_int(index, 4) + encode_int(len(value), 7) + value
