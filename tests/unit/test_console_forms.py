"""The console's grants text (one grant a line) and its SVG charts, without a server."""

from __future__ import annotations

import datetime as dt

import pytest

from control_plane.console.charts import Point, line_chart
from control_plane.console.forms import grants_text, parse_grants_text
from control_plane.errors import InvalidField
from control_plane.grants import grants_to_json

pytestmark = pytest.mark.unit


def test_grants_text_reads_back_as_the_same_grants() -> None:
    grants = parse_grants_text("topic orders* publish,subscribe\n\n  group billing subscribe  \n")
    assert [(g.resource, g.pattern, sorted(g.actions)) for g in grants] == [
        ("topic", "orders*", ["publish", "subscribe"]),
        ("group", "billing", ["subscribe"]),
    ]
    assert parse_grants_text(grants_text(grants_to_json(grants))) == grants


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("topic orders", "line 1: write RESOURCE PATTERN ACTION"),
        ("queue orders publish", "resource"),
        ("topic orders steal", "actions"),
        ("topic or ders publish", "line 1"),
    ],
)
def test_a_malformed_grant_line_is_refused_naming_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_grants_text(text)
    assert says in refused.value.message


def test_a_chart_is_an_accessible_svg_that_escapes_its_labels() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    points = [Point(t0 + dt.timedelta(minutes=i), v) for i, v in enumerate([0, 5, 10])]
    svg = str(line_chart("Bytes <in>", points, fmt=lambda n: f"{n} B"))
    assert svg.startswith("<svg")
    assert 'role="img"' in svg
    assert 'aria-label="Bytes &lt;in&gt;: 3 points, peak 10 B"' in svg
    assert "<polyline" in svg
    assert "<in>" not in svg
    empty = str(line_chart("Nothing", []))
    assert "nothing in this range" in empty
