"""The compiled store module, ``_speedups`` (built from ``_speedups.c``): the one place that
loads it. None when it is not built or ``ORBIT_PURE_PYTHON`` is set, and every user then takes
its pure-Python twin. Light on purpose: the SDK's record decoding asks for it without loading
the store engine."""

from __future__ import annotations

import os
from typing import Any


def speedups() -> Any:
    """``_speedups`` when it is built and ``ORBIT_PURE_PYTHON`` is not set, else None."""
    if os.environ.get("ORBIT_PURE_PYTHON"):
        return None
    try:
        from data_plane.store import _speedups  # type: ignore[attr-defined]
    except ImportError:  # not built (no compiler): the twins serve
        return None
    return _speedups
