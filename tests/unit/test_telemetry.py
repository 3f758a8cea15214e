"""data_plane/telemetry.py: exporter choice, messaging attributes on spans, W3C trace context
through message properties from producer to consumer, broker metrics, and the no-op path."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from data_plane.telemetry import (
    ATTR_MESSAGE_ID,
    DISABLED,
    TRACEPARENT,
    BrokerMetrics,
    Telemetry,
    _otlp_exporters,
    consume_span,
    extract_context,
    inject_context,
    register_replication_lag,
    resolve_exporter,
    send_span,
    setup_telemetry,
)
from tests.unit.telemetry_helpers import only, spans_fixture, tel_fixture  # noqa: F401

pytestmark = pytest.mark.unit


# --- exporter choice -----------------------------------------------------------------------------
def test_the_exporter_comes_from_the_argument_then_the_environment() -> None:
    assert resolve_exporter("none", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "none"
    assert resolve_exporter(None, {}) == "console"
    assert resolve_exporter(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "otlp"
    assert resolve_exporter(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == "otlp"
    assert resolve_exporter(None, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) == "none"
    assert resolve_exporter(None, {"ORBIT_TELEMETRY_EXPORTER": "none"}) == "none"
    assert resolve_exporter(None, {"ORBIT_TELEMETRY_EXPORTER": "bogus"}) == "console"
    with pytest.raises(ValueError, match="unknown exporter"):
        resolve_exporter("jaeger")  # type: ignore[arg-type]


def test_otlp_exporters_are_the_http_ones_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    span_exporter, metric_exporter = _otlp_exporters()
    assert isinstance(span_exporter, OTLPSpanExporter)
    assert isinstance(metric_exporter, OTLPMetricExporter)
    span_exporter.shutdown()  # type: ignore[no-untyped-call]
    metric_exporter.shutdown()


def test_the_console_exporter_prints_spans(capsys: pytest.CaptureFixture[str]) -> None:
    t = setup_telemetry("orbit-console", exporter="console", set_global=False)
    assert t.enabled
    assert t.exporter == "console"
    with send_span(t, "acme%orders"):
        pass
    t.shutdown()
    out = capsys.readouterr().out
    assert '"name": "send orders"' in out
    assert "orbit-console" in out


# --- the no-op path ------------------------------------------------------------------------------
def test_telemetry_off_costs_nothing_and_touches_nothing() -> None:
    t = setup_telemetry("orbit-off", exporter="none", set_global=False)
    assert not t.enabled
    assert t.tracer_provider is None
    assert t.meter_provider is None
    props = {"KEYS": "k"}
    cm1 = send_span(t, "acme%orders", properties=props)
    cm2 = consume_span(DISABLED, "acme%orders", properties=props)
    assert cm1 is cm2  # one shared null context manager: nothing is built per call
    with cm1 as span:
        span.set_attribute(ATTR_MESSAGE_ID, "x")  # a no-op span takes the same calls
        assert not span.is_recording()
    assert props == {"KEYS": "k"}
    m = BrokerMetrics(t)
    m.messages_in("acme", "acme%orders", 1, 10)
    m.send_latency("acme", "acme%orders", 0.001)
    assert m._attrs == {}


# --- spans ---------------------------------------------------------------------------------------
def test_a_send_span_carries_the_messaging_attributes(tel: Telemetry, spans: InMemorySpanExporter) -> None:
    props: dict[str, str] = {}
    with send_span(
        tel, "acme%orders", properties=props, tag="TagA", keys=["k1", "k2"], batch_size=4, body_size=1024
    ) as span:
        span.set_attribute(ATTR_MESSAGE_ID, "7F0000010000")
    s = only(spans, "send orders")
    assert s.kind is SpanKind.PRODUCER
    assert dict(s.attributes or {}) == {
        "messaging.system": "rocketmq",
        "messaging.destination.name": "orders",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.rocketmq.namespace": "acme",
        "messaging.rocketmq.message.tag": "TagA",
        "messaging.rocketmq.message.keys": ("k1", "k2"),
        "messaging.batch.message_count": 4,
        "messaging.message.body.size": 1024,
        "messaging.message.id": "7F0000010000",
    }
    assert s.resource.attributes["service.name"] == "orbit-test"


def test_an_explicit_tenant_wins_and_a_plain_topic_has_no_namespace(
    tel: Telemetry, spans: InMemorySpanExporter
) -> None:
    with send_span(tel, "orders", message_id="m1"):
        pass
    with send_span(tel, "acme%orders", tenant="acme"):
        pass
    plain, named = spans.get_finished_spans()
    assert "messaging.rocketmq.namespace" not in (plain.attributes or {})
    assert (plain.attributes or {})["messaging.message.id"] == "m1"
    assert (named.attributes or {})["messaging.rocketmq.namespace"] == "acme"


def test_the_consumer_span_is_the_producers_child_and_links_to_it(tel: Telemetry, spans: InMemorySpanExporter) -> None:
    props: dict[str, str] = {"TAGS": "TagA"}
    with send_span(tel, "acme%orders", properties=props) as producer:
        pass
    producer_ctx = producer.get_span_context()
    version, trace_id, span_id, flags = props[TRACEPARENT].split("-")
    assert (version, trace_id, span_id) == ("00", f"{producer_ctx.trace_id:032x}", f"{producer_ctx.span_id:016x}")
    assert int(flags, 16) & 1  # sampled

    # ... the properties travel through the broker as strings; the consumer reads them back.
    received = dict(props)
    with consume_span(tel, "acme%orders", properties=received, consumer_group="acme%billing", message_id="m1"):
        pass
    s = only(spans, "process orders")
    assert s.kind is SpanKind.CONSUMER
    assert s.parent is not None
    assert (s.parent.trace_id, s.parent.span_id) == (producer_ctx.trace_id, producer_ctx.span_id)
    assert s.context is not None
    assert s.context.trace_id == producer_ctx.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in s.links] == [
        (producer_ctx.trace_id, producer_ctx.span_id)
    ]
    attrs = dict(s.attributes or {})
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.consumer.group.name"] == "billing"
    assert attrs["messaging.rocketmq.namespace"] == "acme"
    assert attrs["messaging.message.id"] == "m1"


def test_a_receive_span_under_the_current_span_only_links_to_the_producer(
    tel: Telemetry, spans: InMemorySpanExporter
) -> None:
    props: dict[str, str] = {}
    with send_span(tel, "acme%orders", properties=props) as producer:
        pass
    with (
        tel.tracer.start_as_current_span("poll loop") as poll,
        consume_span(tel, "acme%orders", properties=props, operation="receive", as_child=False),
    ):
        pass
    s = only(spans, "receive orders")
    assert s.kind is SpanKind.CLIENT
    assert s.parent is not None
    assert s.parent.span_id == poll.get_span_context().span_id
    assert [link.context.span_id for link in s.links] == [producer.get_span_context().span_id]


def test_a_message_without_trace_context_starts_a_root_span_without_links(
    tel: Telemetry, spans: InMemorySpanExporter
) -> None:
    with consume_span(tel, "acme%orders", properties={"KEYS": "k"}):
        pass
    with consume_span(tel, "acme%orders", properties=None):
        pass
    for s in spans.get_finished_spans():
        assert s.parent is None
        assert list(s.links) == []


def test_inject_and_extract_round_trip_the_trace_state(tel: Telemetry) -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    sc = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "value")]),
    )
    props: dict[str, str] = {}
    inject_context(props, trace.set_span_in_context(NonRecordingSpan(sc)))
    assert props == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=value",
    }
    assert not any(c in v for v in props.values() for c in "\x01\x02")  # safe in RocketMQ properties
    back = trace.get_current_span(extract_context(props)).get_span_context()
    assert (back.trace_id, back.span_id, back.is_remote) == (sc.trace_id, sc.span_id, True)
    assert back.trace_state.get("vendor") == "value"
    assert extract_context({}) == extract_context(None)


# --- broker metrics ------------------------------------------------------------------------------
def test_broker_metrics_count_per_tenant_and_topic() -> None:
    reader = InMemoryMetricReader()
    t = setup_telemetry("orbit-broker-test", exporter="none", metric_readers=[reader], set_global=False)
    m = BrokerMetrics(t)
    m.messages_in("acme", "acme%orders", 3, 300)
    m.messages_in("acme", "acme%orders", 2, 200)
    m.messages_in("globex", "globex%orders", 1, 10)
    m.messages_out("acme", "acme%orders", 4, 400)
    for s in (0.0004, 0.003, 0.2):
        m.send_latency("acme", "acme%orders", s)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[tuple[str, str | None], NumberDataPoint | HistogramDataPoint] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    ns = p.attributes.get("messaging.rocketmq.namespace") if p.attributes else None
                    points[(metric.name, str(ns) if ns is not None else None)] = p  # type: ignore[assignment]
    in_acme = points[("orbit.broker.messages.in", "acme")]
    assert isinstance(in_acme, NumberDataPoint)
    assert in_acme.value == 5
    assert dict(in_acme.attributes or {}) == {
        "messaging.system": "rocketmq",
        "messaging.destination.name": "orders",
        "messaging.rocketmq.namespace": "acme",
    }
    bytes_in = points[("orbit.broker.bytes.in", "acme")]
    assert isinstance(bytes_in, NumberDataPoint)
    assert bytes_in.value == 500
    globex = points[("orbit.broker.messages.in", "globex")]
    assert isinstance(globex, NumberDataPoint)
    assert globex.value == 1
    out = points[("orbit.broker.bytes.out", "acme")]
    assert isinstance(out, NumberDataPoint)
    assert out.value == 400
    hist = points[("orbit.broker.send.duration", "acme")]
    assert isinstance(hist, HistogramDataPoint)
    assert hist.count == 3
    assert hist.explicit_bounds[:3] == (0.0005, 0.001, 0.0025)
    assert hist.bucket_counts[0] == 1  # 0.4 ms is in the first bucket: the bounds are in seconds
    t.shutdown()


def test_the_attribute_cache_is_bounded() -> None:
    reader = InMemoryMetricReader()
    t = setup_telemetry("orbit-broker-test", exporter="none", metric_readers=[reader], set_global=False)
    m = BrokerMetrics(t, max_attribute_sets=10)
    for i in range(100):
        m.messages_in(f"t{i}", f"t{i}%orders", 1, 1)
    assert len(m._attrs) <= 10
    t.shutdown()


def test_replication_lag_gauges_read_their_source_at_collection() -> None:
    reader = InMemoryMetricReader()
    t = setup_telemetry("orbit-broker-test", exporter="none", metric_readers=[reader], set_global=False)
    now: list[tuple[int, float] | None] = [(4096, 0.25)]
    register_replication_lag(t, lambda: now[0], broker_name="broker-a")

    def gauges() -> dict[str, float]:
        data = reader.get_metrics_data()
        out: dict[str, float] = {}
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for p in metric.data.data_points:
                        assert dict(p.attributes or {}) == {"orbit.broker.name": "broker-a"}
                        out[metric.name] = p.value  # type: ignore[union-attr]
        return out

    assert gauges() == {"orbit.broker.replication.lag.bytes": 4096, "orbit.broker.replication.lag.seconds": 0.25}
    now[0] = (0, -1.0)  # a slave: bytes known, seconds not
    assert gauges() == {"orbit.broker.replication.lag.bytes": 0}
    now[0] = None  # nothing to report (no slave connected)
    assert gauges() == {}
    t.shutdown()
