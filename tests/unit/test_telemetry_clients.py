"""The telemetry switches and helpers around the clients: ``telemetry_from_env``, what a client
keeps (None unless on), the trace properties' names, the sent copy of a message, the consumer
span's parent and links, and the ``telemetry`` settings of the control plane."""

from __future__ import annotations

import base64
import logging
import secrets

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from control_plane.app import create_app
from control_plane.settings import MasterKey, Settings, SettingsError
from data_plane.telemetry import (
    DISABLED,
    TRACEPARENT,
    TRACESTATE,
    Telemetry,
    consume_batch_span,
    parse_setting,
    send_span,
)
from sdk import Message, Producer, PullConsumer, PushConsumer, telemetry_from_env
from sdk import telemetry as sdk_telemetry
from sdk.message import SYSTEM_PROPERTIES
from tests.unit.telemetry_helpers import only, spans_fixture, tel_fixture  # noqa: F401

pytestmark = pytest.mark.unit


# --- the switch ---------------------------------------------------------------------------------
def test_orbit_telemetry_switches_the_sdk_on(caplog: pytest.LogCaptureFixture) -> None:
    assert telemetry_from_env(env={}) is None
    assert telemetry_from_env(env={"ORBIT_TELEMETRY": "none"}) is None
    assert telemetry_from_env(env={"ORBIT_TELEMETRY": "console", "OTEL_SDK_DISABLED": "true"}) is None
    with caplog.at_level(logging.WARNING):
        assert telemetry_from_env(env={"ORBIT_TELEMETRY": "jaeger"}) is None
    assert "ORBIT_TELEMETRY='jaeger'" in caplog.text

    on = telemetry_from_env("orbit-test-env", env={"ORBIT_TELEMETRY": "Console"}, set_global=False)
    try:
        assert on is not None
        assert on.enabled
        assert on.exporter == "console"
        assert telemetry_from_env("orbit-test-env", env={"ORBIT_TELEMETRY": "console"}) is on  # one per process
    finally:
        sdk_telemetry._from_env.clear()
        if on is not None:
            on.shutdown()


def test_a_client_keeps_its_telemetry_only_when_it_is_on(tel: Telemetry) -> None:
    addrs = "127.0.0.1:9876"
    assert Producer("p", namesrv_addrs=addrs).telemetry is None
    assert Producer("p", namesrv_addrs=addrs, telemetry=DISABLED).telemetry is None
    assert Producer("p", namesrv_addrs=addrs, telemetry=tel).telemetry is tel
    assert PushConsumer("c", namesrv_addrs=addrs, telemetry=DISABLED).telemetry is None
    assert PushConsumer("c", namesrv_addrs=addrs, telemetry=tel).telemetry is tel
    assert PullConsumer("c", namesrv_addrs=addrs).telemetry is None
    assert PullConsumer("c", namesrv_addrs=addrs, telemetry=tel).telemetry is tel


def test_the_settings_name_none_console_or_otlp() -> None:
    assert parse_setting(" OTLP ") == "otlp"
    with pytest.raises(ValueError, match="not one of none, console, otlp"):
        parse_setting("zipkin")
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    assert Settings.from_env({"ORBIT_MASTER_KEY": key}).telemetry == "none"
    assert Settings.from_env({"ORBIT_MASTER_KEY": key, "ORBIT_TELEMETRY": "otlp"}).telemetry == "otlp"
    assert Settings.from_env({"ORBIT_MASTER_KEY": key, "ORBIT_TELEMETRY": "otlp"}, telemetry="console").telemetry == (
        "console"
    )
    with pytest.raises(SettingsError, match="telemetry 'zipkin'"):
        Settings.from_env({"ORBIT_MASTER_KEY": key, "ORBIT_TELEMETRY": "zipkin"})


def test_off_the_control_plane_installs_no_telemetry_middleware(tel: Telemetry) -> None:
    settings = Settings(master_key=MasterKey(secrets.token_bytes(32)), database_url="postgresql://unused")
    plain = create_app(settings, services=None)
    traced = create_app(settings, services=None, telemetry=tel)
    assert len(traced.middlewares) == len(plain.middlewares) + 1
    assert len(create_app(settings, services=None, telemetry=DISABLED).middlewares) == len(plain.middlewares)


# --- producers ----------------------------------------------------------------------------------
def test_the_trace_properties_are_not_reserved_and_the_callers_message_is_not_changed(tel: Telemetry) -> None:
    assert TRACEPARENT not in SYSTEM_PROPERTIES
    assert TRACESTATE not in SYSTEM_PROPERTIES
    msg = Message("acme%orders", b"x", tags="t", keys=["k1", "k2"], properties={"a": "1"})
    carrier: dict[str, str] = {}
    with sdk_telemetry.producer_span(tel, msg, carrier, message_id="ID1"):
        sent = sdk_telemetry.with_properties(msg, carrier)
    assert set(carrier) == {TRACEPARENT}
    assert msg.properties == {"a": "1"}
    assert sent.properties == {"a": "1", TRACEPARENT: carrier[TRACEPARENT]}
    assert (sent.topic, sent.body, sent.tags, sent.keys) == (msg.topic, msg.body, msg.tags, msg.keys)
    assert Message("t", b"x", properties=sent.properties).properties == sent.properties  # valid user properties
    assert sdk_telemetry.with_properties(msg, {}) is msg


# --- consumers ----------------------------------------------------------------------------------
def test_one_message_is_processed_under_its_producer_and_a_batch_in_a_trace_of_its_own(
    tel: Telemetry, spans: InMemorySpanExporter
) -> None:
    carriers: list[dict[str, str]] = [{}, {}]
    producers = []
    for c in carriers:
        with send_span(tel, "acme%orders", properties=c) as p:
            producers.append(p.get_span_context())
    with tel.tracer.start_as_current_span("started the consumer"):  # the consumer's tasks inherit this
        with consume_batch_span(tel, "acme%orders", [carriers[0]], consumer_group="acme%billing", message_id="m0"):
            pass
        with consume_batch_span(tel, "acme%orders", [*carriers, {}], consumer_group="acme%billing"):
            pass
    one, batch = [s for s in spans.get_finished_spans() if s.name == "process orders"]
    assert one.kind is SpanKind.CONSUMER
    assert one.parent is not None
    assert one.parent.span_id == producers[0].span_id
    assert (one.attributes or {})["messaging.message.id"] == "m0"
    assert batch.parent is None
    assert [link.context.span_id for link in batch.links] == [p.span_id for p in producers]
    attrs = dict(batch.attributes or {})
    assert attrs["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in attrs
    assert attrs["messaging.consumer.group.name"] == "billing"


def test_a_receive_span_is_backdated_under_the_current_span(tel: Telemetry, spans: InMemorySpanExporter) -> None:
    carrier: dict[str, str] = {}
    with send_span(tel, "acme%orders", properties=carrier) as producer:
        pass
    with (
        tel.tracer.start_as_current_span("poll loop") as loop,
        consume_batch_span(tel, "acme%orders", [carrier], operation="receive", as_child=False, start_time=10**9),
    ):
        pass
    r = only(spans, "receive orders")
    assert r.kind is SpanKind.CLIENT
    assert r.start_time == 10**9
    assert r.parent is not None
    assert r.parent.span_id == loop.get_span_context().span_id
    assert [link.context.span_id for link in r.links] == [producer.get_span_context().span_id]
    assert consume_batch_span(DISABLED, "t", [carrier]) is consume_batch_span(DISABLED, "u", [])
