"""What runs Orbit's Python: version, executable and how the interpreter is linked, for the
benchmarks' ``machine`` block. An interpreter loaded from a shared ``libpython`` (pyenv's default
build) ran Orbit's Python paths 1.2-1.5x slower here than one linked into its executable and
built with profile-guided optimization (Debian's); ``scripts/venv.sh`` prefers the latter
(docs/development.md#the-interpreter).

Run as a script by any interpreter (standard library only), it is ``scripts/venv.sh``'s probe:
``<static|shared> <executable>`` when that interpreter can make Orbit's ``.venv`` (3.11+, the
``venv`` module, the C headers), else nothing and exit status 1."""

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


def can_make_venv() -> bool:
    """3.11+, with the ``venv`` module (Debian ships it apart: python3.x-venv) and the C headers
    (without them the compiled fast paths could not be built)."""
    if sys.version_info < (3, 11):  # noqa: UP036  (this runs on any interpreter found)
        return False
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        return False
    import sysconfig

    return os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


if __name__ == "__main__":
    if not can_make_venv():
        raise SystemExit(1)
    # unknown (not Linux) counts as shared: no preference
    print("static" if libpython() == "static" else "shared", os.path.realpath(sys.executable))
