"""What every benchmark command's JSON starts with, and how it is printed and kept."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from typing import Any

import orjson


def header(benchmark: str, argv: list[str] | None) -> dict[str, Any]:
    """``benchmark``, the command line that ran it (``source``) and when (``date``, UTC)."""
    args = argv if argv is not None else sys.argv[1:]
    return {
        "benchmark": benchmark,
        "source": " ".join(["python -m benchmarks." + benchmark, *args]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def emit(result: dict[str, Any], out: str | None) -> None:
    """Print ``result`` as indented JSON, and write it to ``out`` too when given."""
    text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def default_name(benchmark: str) -> str:
    """``<benchmark>-<UTC time>-<git short hash>.json``, as benchmarks/results names runs."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        rev = "nogit"
    return f"{benchmark}-{stamp}-{rev}.json"


def result_path(out: str | None, benchmark: str) -> str | None:
    """``--out``: a file, or a directory to write ``default_name(benchmark)`` into."""
    if out and os.path.isdir(out):
        return os.path.join(out, default_name(benchmark))
    return out
