"""Server-rendered SVG charts: no script, no charting library, readable without colour.

``line_chart`` draws one series (a value at each time, placed by its time) as a polyline over a
light grid with its maximum and the first and last times labelled; the SVG carries a ``<title>`` and
``role="img"`` with an ``aria-label`` summing it up for screen readers, and the page shows the
same figures as a table beside it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH = 560
HEIGHT = 160
PAD_LEFT = 64
PAD_BOTTOM = 22
PAD_TOP = 12
PAD_RIGHT = 8


@dataclass(frozen=True, slots=True)
class Point:
    at: dt.datetime
    value: float


def number(value: float) -> str:
    """A whole number as it is, any other with two decimals."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def line_chart(
    title: str,
    points: Sequence[Point],
    *,
    fmt: Callable[[float], str] = number,
    time_format: str = "%m-%d %H:%M",
    span: tuple[dt.datetime, dt.datetime] | None = None,
) -> Markup:
    """``time_format``: how the axis's ends are labelled (strftime); ``span``: the time axis's
    ends (default: the first and the last point's times)."""
    top = max((p.value for p in points), default=0)
    label = f"{title}: {len(points)} points, peak {fmt(top)}"
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg"><title>{escape(label)}</title>',
        f'<rect x="{PAD_LEFT}" y="{PAD_TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for i in range(1, 4):
        y = PAD_TOP + plot_h * i / 4
        parts.append(f'<line x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    parts.append(
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 10}" text-anchor="end" font-size="11">{escape(fmt(top))}</text>'
    )
    parts.append(f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" text-anchor="end" font-size="11">0</text>')
    if not points:
        parts.append(f'<text x="{PAD_LEFT + plot_w / 2}" y="{PAD_TOP + plot_h / 2}" text-anchor="middle" '
                     'font-size="12" fill="#666">nothing in this range</text>')  # fmt: skip
    else:
        t0, t1 = span if span is not None else (points[0].at, points[-1].at)
        span_s = (t1 - t0).total_seconds() or 1.0  # x: time (a gap shows as one)
        scale = plot_h / top if top else 0.0
        coords = " ".join(
            f"{PAD_LEFT + plot_w * (p.at - t0).total_seconds() / span_s:.1f},{PAD_TOP + plot_h - p.value * scale:.1f}"
            for p in points
        )
        parts.append(f'<polyline fill="none" stroke="#1f5fbf" stroke-width="2" points="{coords}"/>')
        if len(points) == 1:
            cx, cy = coords.split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="#1f5fbf"/>')
        y_text = HEIGHT - 6
        first, last = t0.strftime(time_format), t1.strftime(time_format)
        parts.append(f'<text x="{PAD_LEFT}" y="{y_text}" font-size="11">{escape(first)}</text>')
        parts.append(
            f'<text x="{WIDTH - PAD_RIGHT}" y="{y_text}" text-anchor="end" font-size="11">{escape(last)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
