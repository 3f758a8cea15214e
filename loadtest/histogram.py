"""Latency histograms: HdrHistogram (1 µs .. 60 s, 3 significant digits) for every latency the
load tools record, and the one way they travel between processes and machines — base64 of
HdrHistogram's compressed encoding. Keeping the encoding in one place is what makes histograms
from different generator processes (or machines) mergeable without loss."""

from __future__ import annotations

import base64
from array import array
from collections.abc import Iterable

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 60_000_000
DIGITS = 3
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def new_hist() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)


def record_us(h: HdrHistogram, value_us: float) -> None:
    """Record a latency in µs, clamped into the histogram's range (a value past 60 s is kept as
    60 s rather than dropped: a stall must still show in the tail)."""
    h.record_value(min(HIGHEST_US, max(LOWEST_US, int(value_us))))


def latency_log() -> array[int]:
    """Where a worker keeps its latencies (µs) while a phase runs, for ``hist_of`` afterwards:
    an ``array``, not a list. A list of a phase's 300,000 ints is one container the garbage
    collector walks element by element whenever a collection reaches its generation (1-4 ms
    here, and 7-14 ms for floats measured alongside), a pause of the generator that the
    latencies it records then show; an array holds no objects to walk."""
    return array("q")


def hist_of(values_us: Iterable[float]) -> HdrHistogram:
    """A histogram of latencies gathered as plain numbers while a phase ran: ``record_value``
    costs ~2.2 µs in pure Python, a list append ~0.2 µs, so the workers record afterwards and
    the load they generate is not slowed by its own measuring."""
    h = new_hist()
    for v in values_us:
        record_us(h, v)
    return h


def encode_hist(h: HdrHistogram) -> str:
    """An empty histogram encodes as "" (HdrHistogram cannot decode an empty encoding)."""
    return base64.b64encode(h.encode()).decode() if h.get_total_count() else ""


def decode_hist(encoded: str) -> HdrHistogram:
    h = new_hist()
    if encoded:
        h.add(HdrHistogram.decode(base64.b64decode(encoded)))
    return h


def merge(encoded: Iterable[str]) -> HdrHistogram:
    """One histogram holding every recorded value of ``encoded`` (counts add up exactly)."""
    h = new_hist()
    for e in encoded:
        if e:
            h.add(HdrHistogram.decode(base64.b64decode(e)))
    return h


def summary_ms(h: HdrHistogram, pcts: tuple[float, ...] = (50, 99, 99.9)) -> dict[str, float]:
    out: dict[str, float] = {"count": h.get_total_count()}
    for p in pcts:
        out[f"p{p:g}"] = round(h.get_value_at_percentile(p) / 1000, 3) if out["count"] else 0.0
    out["max"] = round(h.get_max_value() / 1000, 3) if out["count"] else 0.0
    return out


def distribution_ms(h: HdrHistogram, *, points: int = 60) -> list[tuple[float, float]]:
    """(percentile, latency ms) pairs on a log scale of 1/(1-p) up to the max — what a latency
    distribution plot draws; empty for an empty histogram."""
    if not h.get_total_count():
        return []
    out: list[tuple[float, float]] = []
    for i in range(points + 1):
        p = 100.0 * (1 - 10 ** (-5.0 * i / points))  # 0 .. 99.999
        out.append((round(p, 4), h.get_value_at_percentile(p) / 1000))
    out.append((100.0, h.get_max_value() / 1000))
    return out
