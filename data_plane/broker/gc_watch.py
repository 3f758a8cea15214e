"""GcWatch: how long CPython's garbage collector stops the broker, as runtime figures.

A collection runs on whatever thread allocates when a generation's threshold is crossed, and
holds the GIL throughout: every request in flight waits for it. A full (generation 2)
collection walks every tracked object, which in a started broker (~43,000 objects: modules,
config, the recovered store) took ~48 ms on the project's 2-core VM. ``orbit broker`` therefore
freezes what exists once it serves (``gc.freeze``: those objects move to a permanent generation
no collection walks), and a full collection afterwards walks only what came since.

Figures (GET_BROKER_RUNTIME_INFO): ``gcFrozenObjects`` (``gc.get_freeze_count()``),
``maxGcPauseMs`` (the longest collection since start, any generation) and
``gcFullCollections``.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any


class GcWatch:
    def __init__(self) -> None:
        self.max_pause_ms = 0.0
        self.full_collections = 0
        self._started = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        ms = (time.perf_counter() - self._started) * 1000
        self.max_pause_ms = max(self.max_pause_ms, ms)
        if info.get("generation") == 2:
            self.full_collections += 1

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)

    def runtime_info(self) -> dict[str, Any]:
        return {
            "gcFrozenObjects": gc.get_freeze_count(),
            "maxGcPauseMs": round(self.max_pause_ms, 1),
            "gcFullCollections": self.full_collections,
        }
