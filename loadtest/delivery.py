"""Which messages were acknowledged and which delivered, exactly: a bit per sequence number of
each (producer, key), so lost and duplicated messages are counted over the whole run, across
every consumer process.

A producer sets a message's bit once its send is acknowledged; a consumer sets it on delivery
and counts the deliveries. The parent ORs the consumers' sets: *lost* = acknowledged but never
delivered, *duplicated* = deliveries beyond the distinct messages delivered, and *stored
unacknowledged* = delivered though its send failed (a timeout whose message the broker kept).
Sets travel compressed (zlib): a run of consecutive numbers compresses to almost nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

Key = tuple[int, int]  # producer index, key


class SeqSet:
    """Sequence numbers (>= 0) as a growing bitmap."""

    __slots__ = ("bits",)

    def __init__(self) -> None:
        self.bits = bytearray()

    def add(self, seq: int) -> None:
        i = seq >> 3
        if i >= len(self.bits):
            self.bits.extend(bytes(i - len(self.bits) + 4096))
        self.bits[i] |= 1 << (seq & 7)

    def encode(self) -> bytes:
        return zlib.compress(bytes(self.bits), 1)


class Tally:
    """One generator's sets, per (producer, key), and its deliveries."""

    __slots__ = ("deliveries", "sets")

    def __init__(self) -> None:
        self.sets: dict[Key, SeqSet] = {}
        self.deliveries = 0

    def add(self, key: Key, seq: int) -> None:
        s = self.sets.get(key)
        if s is None:
            s = self.sets[key] = SeqSet()
        s.add(seq)

    def encode(self) -> dict[str, Any]:
        return {"deliveries": self.deliveries, "sets": {k: s.encode() for k, s in self.sets.items()}}


def _union(encoded: Iterable[dict[str, Any]]) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for e in encoded:
        for k, blob in e["sets"].items():
            key = (int(k[0]), int(k[1]))
            out[key] = out.get(key, 0) | int.from_bytes(zlib.decompress(blob), "little")
    return out


def summary(acked: Iterable[dict[str, Any]], delivered: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Lost, duplicated and stored-unacknowledged counts from the producers' and consumers'
    encoded tallies (``Tally.encode``)."""
    delivered = list(delivered)
    a, d = _union(acked), _union(delivered)
    n_acked = sum(v.bit_count() for v in a.values())
    distinct = sum(v.bit_count() for v in d.values())
    lost = sum((v & ~d.get(k, 0)).bit_count() for k, v in a.items())
    extra = sum((v & ~a.get(k, 0)).bit_count() for k, v in d.items())
    deliveries = sum(int(e["deliveries"]) for e in delivered)
    return {
        "acknowledged": n_acked,
        "delivered_distinct": distinct,
        "deliveries": deliveries,
        "lost": lost,
        "duplicated": deliveries - distinct,
        "stored_unacknowledged": extra,
    }
