"""Rate control for open-loop load: when each message is *meant* to be sent.

A generator that waits for an answer before sending the next message (closed loop) sends less
while the server stalls, so the stall hides in a handful of slow samples — coordinated omission.
Open loop fixes the schedule in advance: message i is due at ``start + offset_i`` whatever
happened before, its latency is measured from that intended time, and a stall shows up as a
run of late messages, each counted with the lateness it suffered.

``RateProfile`` is a piecewise-constant target rate (a steady rate, optionally with a burst of
``factor`` x for a while, or a ramp: linear in steps of ``RAMP_STEP_S``, a hold, a fall);
``OpenLoop`` walks its schedule against a clock and hands out the intended times that are due.
Both are pure: no sleeping, no I/O — the worker drives them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

RAMP_STEP_S = 1.0  # a linear ramp's steps: constant rates this long, each at the ramp's rate at its middle


@dataclass(frozen=True, slots=True)
class Segment:
    """``msgs_per_s`` from ``start_s`` (inclusive) to ``end_s`` (exclusive), offsets from the
    start of the run."""

    start_s: float
    end_s: float
    msgs_per_s: float


@dataclass(frozen=True, slots=True)
class RateProfile:
    segments: tuple[Segment, ...]

    @classmethod
    def steady(
        cls,
        *,
        msgs_per_s: float,
        duration_s: float,
        burst_at_s: float = 0.0,
        burst_duration_s: float = 0.0,
        burst_factor: float = 1.0,
    ) -> RateProfile:
        """``msgs_per_s`` for ``duration_s``; with a burst, ``burst_factor`` x that rate from
        ``burst_at_s`` for ``burst_duration_s`` (clipped to the run)."""
        if msgs_per_s <= 0 or duration_s <= 0:
            raise ValueError("msgs_per_s and duration_s must be > 0")
        if burst_duration_s <= 0 or burst_factor == 1.0:
            return cls((Segment(0.0, duration_s, msgs_per_s),))
        b0 = min(max(0.0, burst_at_s), duration_s)
        b1 = min(duration_s, b0 + burst_duration_s)
        parts = [
            Segment(0.0, b0, msgs_per_s),
            Segment(b0, b1, msgs_per_s * burst_factor),
            Segment(b1, duration_s, msgs_per_s),
        ]
        return cls(tuple(s for s in parts if s.end_s > s.start_s))

    @classmethod
    def ramp(
        cls,
        *,
        start_msgs_per_s: float,
        lead_s: float,
        to: float,
        over_s: float,
        hold_s: float,
        fall_to: float,
        fall_s: float,
    ) -> RateProfile:
        """``start_msgs_per_s`` for ``lead_s``, then linearly to ``to`` over ``over_s`` (steps of
        RAMP_STEP_S), ``to`` for ``hold_s``, then ``fall_to`` for ``fall_s``."""
        if min(start_msgs_per_s, to, fall_to) <= 0:
            raise ValueError("rates must be > 0")
        parts: list[Segment] = []
        if lead_s > 0:
            parts.append(Segment(0.0, lead_s, start_msgs_per_s))
        t = lead_s
        steps = math.ceil(over_s / RAMP_STEP_S - 1e-9)
        for _ in range(steps):
            end = min(lead_s + over_s, t + RAMP_STEP_S)
            mid = ((t + end) / 2 - lead_s) / over_s
            parts.append(Segment(t, end, start_msgs_per_s + (to - start_msgs_per_s) * mid))
            t = end
        for length, rate in ((hold_s, to), (fall_s, fall_to)):
            if length > 0:
                parts.append(Segment(t, t + length, rate))
                t += length
        return cls(tuple(parts))

    def scaled(self, factor: float) -> RateProfile:
        """The same shape at ``factor`` x the rate: one generator's share of the total."""
        return RateProfile(tuple(Segment(s.start_s, s.end_s, s.msgs_per_s * factor) for s in self.segments))

    @property
    def duration_s(self) -> float:
        return self.segments[-1].end_s if self.segments else 0.0

    def count(self) -> int:
        """How many messages the schedule holds."""
        return sum(_segment_count(s) for s in self.segments)

    def offsets_s(self) -> Iterator[float]:
        """Each message's intended send time (seconds from the start), in order, evenly spaced
        within a segment."""
        for s in self.segments:
            interval = 1.0 / s.msgs_per_s
            for i in range(_segment_count(s)):
                yield s.start_s + i * interval

    def count_between(self, a_s: float, b_s: float) -> float:
        """How many messages the schedule holds in ``[a_s, b_s)`` (the rates' integral)."""
        return sum(max(0.0, min(b_s, s.end_s) - max(a_s, s.start_s)) * s.msgs_per_s for s in self.segments)

    def rate_at(self, t_s: float) -> float:
        for s in self.segments:
            if s.start_s <= t_s < s.end_s:
                return s.msgs_per_s
        return 0.0


def _segment_count(s: Segment) -> int:
    return max(0, math.ceil((s.end_s - s.start_s) * s.msgs_per_s - 1e-9))


class OpenLoop:
    """Walks a schedule of intended send times (absolute, in the driver's clock).

    ``due(now)`` returns every intended time ≤ ``now`` not handed out yet — all of them, however
    late: a generator that was held up sends the backlog at once and each message's latency
    still counts from when it was meant to go. ``next_at()`` is when the next one is due (None
    once the schedule is exhausted), so the driver knows how long it may sleep.
    """

    __slots__ = ("_next", "_offsets", "handed_out", "start_s")

    def __init__(self, profile: RateProfile, *, start_s: float) -> None:
        self.start_s = start_s
        self._offsets = profile.offsets_s()
        self._next: float | None = next(self._offsets, None)
        self.handed_out = 0

    def next_at(self) -> float | None:
        return None if self._next is None else self.start_s + self._next

    def due(self, now_s: float, *, limit: int = 1_000_000) -> list[float]:
        """Intended times due by ``now_s``, oldest first (at most ``limit``: the rest stay due)."""
        out: list[float] = []
        while self._next is not None and self.start_s + self._next <= now_s and len(out) < limit:
            out.append(self.start_s + self._next)
            self._next = next(self._offsets, None)
        self.handed_out += len(out)
        return out
