"""Inbound limits of a RemotingServer: how much its peers, authenticated or not, can make it hold.

A server buffers the start of a frame until the frame's last byte arrives. Unbounded, connections
that announce large frames and then send them slowly (or never) make a broker or a name server hold
everything they announce. ``InboundLimits`` are the settings (broker config, name server flags);
``InboundGuard`` keeps one server's accounting. A ``Connection`` consults it only when something
changes — a connection opens or closes, an incomplete frame starts, learns its length or ends — so
the cost is a few integer operations a read, never work per byte:

* Connections: at most ``max_connections_total`` open, at most ``max_connections_per_address``
  from one source address (the peer's IP). A connection past either is closed as it is accepted.
* Incomplete frames: a frame that does not complete in the read that starts it reserves its whole
  size (the length field) as soon as its 4-byte length prefix is in. All connections' reservations
  stay within ``max_partial_frame_bytes_total``; the connection whose frame would pass it is
  closed before any more of it is buffered. A frame once admitted is not cut short by the total,
  and frames that arrive whole in one read reserve nothing.
* Unproven connections. A connection is *proven* once its peer authenticated — a request the
  server's ``before`` check (``Processors.before``, the authentication hook) let through — or, on a
  server without such a check (authentication off), once it completed one frame (a malformed one
  closes the connection instead). Until then a frame of more than ``max_first_frame_bytes`` is
  admitted only within ``max_large_first_frame_bytes_total``, an allowance all unproven connections
  share (0: such a frame is refused outright). A client's first request can be a large send — the
  SDK's and RocketMQ's producers send to a broker before any heartbeat, up to the broker's message
  size limit — so refusing every large first frame would break them, while the shared allowance
  caps what a flood of fresh connections announcing large frames can hold at that much in all.
  Once proven, a connection's frames are limited by ``max_frame_bytes`` and the total only.
* Deadline: a frame must be complete within ``frame_complete_timeout_ms`` of its first byte, else
  its connection is closed (a peer trickling bytes cannot hold a reservation for ever). The server
  sweeps the connections holding an incomplete frame every quarter of the deadline (at most every
  second); time during which the server itself stopped reading a connection (back-pressure: the
  peer does not read the answers) does not count.

Every refusal closes the connection (abort), is counted in ``refused`` under its reason — the name
of the setting that refused it; ``max_frame_bytes`` and ``malformed_frame`` count the frames the
decoder refuses — and is logged as one line with the source address, rate-limited per reason
(``data_plane/refusal_log.py``), so a flood cannot flood the log.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from data_plane.refusal_log import RefusalLog

if TYPE_CHECKING:
    from data_plane.remoting.connection import Connection

log = logging.getLogger(__name__)

# Refusal reasons: the setting that refused (``refused`` keys, the ``orbit.remoting.refused`` metric).
MAX_CONNECTIONS_TOTAL: Final = "max_connections_total"
MAX_CONNECTIONS_PER_ADDRESS: Final = "max_connections_per_address"
MAX_PARTIAL_FRAME_BYTES_TOTAL: Final = "max_partial_frame_bytes_total"
MAX_FIRST_FRAME_BYTES: Final = "max_first_frame_bytes"
FRAME_COMPLETE_TIMEOUT: Final = "frame_complete_timeout_ms"
MAX_FRAME_BYTES: Final = "max_frame_bytes"
MALFORMED_FRAME: Final = "malformed_frame"
REASONS: Final = (
    MAX_CONNECTIONS_TOTAL,
    MAX_CONNECTIONS_PER_ADDRESS,
    MAX_PARTIAL_FRAME_BYTES_TOTAL,
    MAX_FIRST_FRAME_BYTES,
    FRAME_COMPLETE_TIMEOUT,
    MAX_FRAME_BYTES,
    MALFORMED_FRAME,
)

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class InboundLimits:
    """What one server's peers may make it hold (see the module's docstring)."""

    max_partial_frame_bytes_total: int = 256 * MIB
    max_first_frame_bytes: int = 1 * MIB
    max_large_first_frame_bytes_total: int = 32 * MIB
    frame_complete_timeout_ms: int = 30_000
    max_connections_per_address: int = 1_000
    max_connections_total: int = 10_000

    def problems(self, max_frame_bytes: int) -> list[str]:
        """Why these limits cannot be used with frames of up to ``max_frame_bytes`` (none: [])."""
        out = []
        for name in (
            "max_first_frame_bytes",
            "max_connections_per_address",
            "max_connections_total",
        ):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1")
        if self.max_large_first_frame_bytes_total < 0:
            out.append("max_large_first_frame_bytes_total must be >= 0 (0: a larger first frame is refused)")
        if self.max_partial_frame_bytes_total < max_frame_bytes:
            out.append(
                f"max_partial_frame_bytes_total must be >= max_frame_bytes ({max_frame_bytes}): "
                "else a frame of the largest size could never be buffered"
            )
        if self.frame_complete_timeout_ms < 100:
            out.append("frame_complete_timeout_ms must be >= 100")
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per ``InboundLimits`` setting (``--max-connections-total`` …), for a server's
    command line (the name server's; a broker takes them as config settings)."""
    defaults = InboundLimits()
    for f in dataclasses.fields(InboundLimits):
        default = getattr(defaults, f.name)
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=int, default=default, metavar="N",
            help=f"inbound limit (data_plane/remoting/limits.py; default {default})",
        )  # fmt: skip


def from_arguments(args: argparse.Namespace) -> InboundLimits:
    """The ``InboundLimits`` of flags ``add_arguments`` added (not validated: ``problems``)."""
    return InboundLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(InboundLimits)})


class InboundGuard:
    """One server's accounting under ``limits``: connections by source address, the bytes
    reserved by incomplete frames, the refusals by reason. ``partial`` holds the connections
    with an incomplete frame (what the deadline sweep looks at). No locks: the event loop's."""

    __slots__ = (
        "_clock",
        "_log",
        "connections",
        "large_first_bytes",
        "limits",
        "partial",
        "partial_bytes",
        "per_address",
        "refused",
    )

    def __init__(self, limits: InboundLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.connections = 0
        self.per_address: dict[str, int] = {}
        self.partial_bytes = 0  # reserved by all incomplete frames
        self.large_first_bytes = 0  # of which: unproven connections' frames over max_first_frame_bytes
        self.partial: set[Connection] = set()
        self.refused: Counter[str] = Counter()
        self._log = RefusalLog(log, "connections closed", counts=self.refused, clock=clock)
        self._clock = clock

    # --- connections ---------------------------------------------------------------------------
    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; or the reason it is refused (not counted)."""
        lim = self.limits
        if self.connections >= lim.max_connections_total:
            return MAX_CONNECTIONS_TOTAL
        held = self.per_address.get(address, 0)
        if held >= lim.max_connections_per_address:
            return MAX_CONNECTIONS_PER_ADDRESS
        self.per_address[address] = held + 1
        self.connections += 1
        return None

    def gone(self, address: str) -> None:
        """An admitted connection from ``address`` closed."""
        self.connections -= 1
        left = self.per_address.get(address, 0) - 1
        if left > 0:
            self.per_address[address] = left
        else:
            self.per_address.pop(address, None)

    # --- incomplete frames ---------------------------------------------------------------------
    def reserve(self, nbytes: int, unproven: bool) -> str | None:
        """Reserve ``nbytes`` for an incomplete frame of a connection (``unproven``: not yet
        proven); or the reason it is refused (nothing reserved)."""
        lim = self.limits
        if self.partial_bytes + nbytes > lim.max_partial_frame_bytes_total:
            return MAX_PARTIAL_FRAME_BYTES_TOTAL
        if unproven and nbytes > lim.max_first_frame_bytes:
            if self.large_first_bytes + nbytes > lim.max_large_first_frame_bytes_total:
                return MAX_FIRST_FRAME_BYTES
            self.large_first_bytes += nbytes
        self.partial_bytes += nbytes
        return None

    def release(self, nbytes: int, unproven: bool) -> None:
        """Give back what ``reserve(nbytes, unproven)`` took."""
        self.partial_bytes -= nbytes
        if unproven and nbytes > self.limits.max_first_frame_bytes:
            self.large_first_bytes -= nbytes

    # --- refusals ------------------------------------------------------------------------------
    def refuse(self, reason: str, peer: str, detail: str) -> None:
        """Count a refusal and log it (one line naming ``peer``), rate-limited per reason."""
        self._log(reason, "closing connection from %s (%s): %s", peer, reason, detail)
