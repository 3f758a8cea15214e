"""GcWatch: the broker's figures for garbage-collector pauses."""

from __future__ import annotations

import gc

from data_plane.broker.gc_watch import GcWatch


def test_collections_are_timed_and_full_ones_counted_while_installed() -> None:
    watch = GcWatch()
    watch.install()
    watch.install()  # once only
    try:
        garbage = [[i] for i in range(200_000)]  # a full collection has something to walk
        full = watch.full_collections  # (making them may have run some already)
        gc.collect()
        assert watch.full_collections == full + 1  # installed twice, counted once
        gc.collect(0)
        assert watch.full_collections == full + 1  # a young collection is not a full one
        assert watch.max_pause_ms > 0
        del garbage
    finally:
        watch.remove()
    watch.remove()  # twice is fine
    before = (watch.full_collections, watch.max_pause_ms)
    gc.collect()
    assert (watch.full_collections, watch.max_pause_ms) == before
    info = watch.runtime_info()
    assert info["gcFullCollections"] == full + 1
    assert info["gcFrozenObjects"] == gc.get_freeze_count()
    assert info["maxGcPauseMs"] == round(watch.max_pause_ms, 1)
