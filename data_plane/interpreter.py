"""What runs Orbit's Python: version, executable and how the interpreter is linked, for the
benchmarks' ``machine`` block. An interpreter loaded from a shared ``libpython`` (pyenv's default
build) ran Orbit's Python paths 1.2-1.5x slower here than one linked into its executable and
built with profile-guided optimization (Debian's); ``scripts/venv.sh`` prefers the latter
(docs/development.md#the-interpreter)."""

from __future__ import annotations

import os
import platform
import sys


def libpython() -> str:
    """``static`` (the interpreter is part of the executable), ``shared`` (loaded from
    libpython*.so) or ``unknown`` (no /proc/self/maps to tell by)."""
    try:
        with open("/proc/self/maps") as f:
            return "shared" if any("libpython" in line for line in f) else "static"
    except OSError:
        return "unknown"


def interpreter_facts() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "python_executable": os.path.realpath(sys.executable),
        "libpython": libpython(),
    }
