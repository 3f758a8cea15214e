"""The console's charts of stored load history (``LoadService``, fed by brokers' load reports):
a consumer group's backlog and consume rate, a topic's publish rate, over the last hour or day
(``?range=hour|day``). They do not depend on anyone having watched the page."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from markupsafe import Markup

from control_plane.console import charts
from control_plane.errors import InvalidField

RANGES = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1)}


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    svg: Markup
    points: list[charts.Point]
    latest: float | None  # the last bucket's figure (None: no figures at all)


@dataclass(frozen=True, slots=True)
class Window:
    name: str  # "hour" | "day"
    start: dt.datetime
    end: dt.datetime

    @property
    def time_format(self) -> str:
        return "%H:%M" if self.name == "hour" else "%m-%d %H:%M"


def window(request: web.Request) -> Window:
    name = request.query.get("range", "hour")
    if name not in RANGES:
        raise InvalidField("range", "must be hour or day")
    end = dt.datetime.now(dt.UTC)
    return Window(name, end - RANGES[name], end)


def chart(title: str, buckets: list[dict[str, Any]], field: str, w: Window) -> Chart:
    """``field`` of each bucket that has it (a bucket no broker reported for is left out)."""
    points = [
        charts.Point(dt.datetime.fromisoformat(b["start"]), b[field]) for b in buckets if b.get(field) is not None
    ]
    svg = charts.line_chart(title, points, time_format=w.time_format, span=(w.start, w.end))
    return Chart(title, svg, points, points[-1].value if points else None)
