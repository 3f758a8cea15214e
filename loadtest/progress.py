"""The live progress line on stderr: elapsed time, publish and consume rates over the last
second, and p99 latencies — rewritten in place with a carriage return. Quiet when stderr is not
a terminal (CI logs, pipes), where a line a second would only be noise."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, *, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._width = 0

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def done(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def line(
    *,
    case: str,
    elapsed_s: float,
    total_s: float,
    published_per_s: float,
    consumed_per_s: float,
    send_p99_ms: float | None,
    e2e_p99_ms: float | None,
    errors: int,
) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} ms"

    return (
        f"[{case}] {elapsed_s:5.0f}/{total_s:.0f} s  pub {published_per_s:9,.0f}/s  con {consumed_per_s:9,.0f}/s"
        f"  p99 send {ms(send_p99_ms)}  e2e {ms(e2e_p99_ms)}  errors {errors}"
    )
