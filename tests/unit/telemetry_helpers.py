"""Telemetry recording into memory, for the telemetry unit tests:

    from tests.unit.telemetry_helpers import only, spans_fixture, tel_fixture  # noqa: F401

(fixtures ``spans``, an in-memory span exporter, and ``tel``, a Telemetry exporting to it; shut
down after the test). ``only`` is the one finished span of a name.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from data_plane.telemetry import Telemetry, setup_telemetry


@pytest.fixture(name="spans")
def spans_fixture() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(name="tel")
def tel_fixture(spans: InMemorySpanExporter) -> Iterator[Telemetry]:
    t = setup_telemetry("orbit-test", exporter="none", span_exporters=[spans], set_global=False)
    yield t
    t.shutdown()


def only(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in spans.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in spans.get_finished_spans()]
    return found[0]
