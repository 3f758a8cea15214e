"""OpenTelemetry for Orbit's processes: the control plane, brokers and the SDK.

    tel = setup_telemetry("orbit-broker")                  # console, or OTLP/HTTP when configured
    with send_span(tel, "acme%orders", properties=props):  # PRODUCER span; traceparent → props
        ...
    with consume_span(tel, "acme%orders", properties=props, operation="process"):
        ...                                                # child of (and linked to) the producer
    metrics = BrokerMetrics(tel); metrics.messages_in("acme", "acme%orders", 32, 32 * 1024)

Exporter (``setup_telemetry(exporter=...)``; None picks from the environment):

    OTEL_SDK_DISABLED=true                      none
    ORBIT_TELEMETRY_EXPORTER=console|otlp|none  that one
    OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_)   otlp — OTLP/HTTP protobuf, the exporter reads the
                                                standard OTEL_EXPORTER_OTLP_* variables itself;
                                                console (with a warning) if the package is missing
    otherwise                                   console

``none`` without test exporters gives the DISABLED telemetry: no providers at all, and every
helper here returns at its first line (``send_span`` hands back one shared null context manager,
``BrokerMetrics`` methods return before building attributes), so instrumented hot paths cost a
function call when telemetry is off.

Attributes follow the OpenTelemetry messaging semantic conventions (semconv 1.27+):
``messaging.system="rocketmq"``, ``messaging.destination.name`` (the topic without the tenant's
namespace), ``messaging.rocketmq.namespace`` (the tenant), ``messaging.operation.type`` —
``send`` for producers (semconv's replacement for the deprecated ``publish``), ``receive`` and
``process`` for consumers — ``messaging.operation.name``, ``messaging.message.id``,
``messaging.consumer.group.name``. Span names are ``"{operation} {topic}"``.

Trace context travels in the message's properties as W3C ``traceparent`` / ``tracestate``
(RocketMQ properties are a string map; neither value can hold its separators \\x01 / \\x02).
A consumer span is a child of the producer's span by default and always carries a link to it
(the conventions' recommended shape for process spans that may cover batches).
``consume_batch_span`` covers several messages (a listener call, a poll) with one span linked to
each producer span; ``messaging_attributes``, ``producer_links``, ``end_request_span`` build the
broker's request spans (``data_plane/broker/send.py``, ``pull.py``). Where each process turns it
on: docs/broker.md, docs/control_plane.md, sdk/README.md (section "Observability").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Literal

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from data_plane.tenancy.namespace import tenant_of

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

ExporterName = Literal["console", "otlp", "none"]
ConsumeOperation = Literal["receive", "process"]

MESSAGING_SYSTEM = "rocketmq"
# Attribute names (semconv's, spelled out so the stable API is all this module needs).
ATTR_SYSTEM = "messaging.system"
ATTR_DESTINATION = "messaging.destination.name"
ATTR_OPERATION_TYPE = "messaging.operation.type"
ATTR_OPERATION_NAME = "messaging.operation.name"
ATTR_MESSAGE_ID = "messaging.message.id"
ATTR_NAMESPACE = "messaging.rocketmq.namespace"
ATTR_CONSUMER_GROUP = "messaging.consumer.group.name"
ATTR_TAG = "messaging.rocketmq.message.tag"
ATTR_KEYS = "messaging.rocketmq.message.keys"
ATTR_BATCH_COUNT = "messaging.batch.message_count"
ATTR_BODY_SIZE = "messaging.message.body.size"
ATTR_PARTITION = "messaging.destination.partition.id"
ATTR_ERROR_TYPE = "error.type"
ATTR_RESPONSE_CODE = "orbit.response.code"  # a broker's answer (RocketMQ ResponseCode)
OP_SEND = "send"
OP_RECEIVE = "receive"
OP_PROCESS = "process"
MAX_LINKS = 128  # the SDK's default span link limit: a larger batch links to its first 128 producers
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

SEND_DURATION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP_SPAN_CM: AbstractContextManager[Span] = contextlib.nullcontext(INVALID_SPAN)
_global_installed = False
# What a process's ``telemetry`` setting may say (broker config, control-plane settings, ORBIT_TELEMETRY).
TELEMETRY_SETTINGS: tuple[ExporterName, ...] = ("none", "console", "otlp")


class Telemetry:
    """What ``setup_telemetry`` made: providers (None when disabled), a tracer and a meter."""

    __slots__ = ("enabled", "exporter", "meter", "meter_provider", "service_name", "tracer", "tracer_provider")

    def __init__(
        self,
        service_name: str,
        exporter: ExporterName,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
    ) -> None:
        self.service_name = service_name
        self.exporter = exporter
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.enabled = tracer_provider is not None
        self.tracer: trace.Tracer = (
            tracer_provider.get_tracer("orbit") if tracer_provider is not None else trace.NoOpTracer()
        )
        self.meter: metrics.Meter = (
            meter_provider.get_meter("orbit") if meter_provider is not None else metrics.NoOpMeter("orbit")
        )

    def force_flush(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()
        if self.meter_provider is not None:
            self.meter_provider.force_flush()

    def shutdown(self) -> None:
        """Flush and stop the exporters (at process exit)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


DISABLED = Telemetry("orbit", "none", None, None)


def otlp_available() -> bool:
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_exporter(requested: ExporterName | None = None, env: Mapping[str, str] | None = None) -> ExporterName:
    """The exporter to use: ``requested`` if given, else what the environment says."""
    env = os.environ if env is None else env
    if requested is not None:
        if requested not in ("console", "otlp", "none"):
            raise ValueError(f"unknown exporter {requested!r}")
        return requested
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "none"
    chosen = env.get("ORBIT_TELEMETRY_EXPORTER", "").strip().lower()
    if chosen in ("console", "otlp", "none"):
        return chosen  # type: ignore[return-value]
    if chosen:
        log.warning("ORBIT_TELEMETRY_EXPORTER=%r is not console, otlp or none: ignored", chosen)
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        if otlp_available():
            return "otlp"
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not installed: "
            "exporting to the console"
        )
    return "console"


def setup_telemetry(
    service_name: str,
    *,
    exporter: ExporterName | None = None,
    service_version: str | None = None,
    resource_attributes: Mapping[str, AttributeValue] | None = None,
    span_exporters: Sequence[SpanExporter] = (),
    metric_readers: Sequence[MetricReader] = (),
    metric_export_interval_ms: int = 60_000,
    set_global: bool = True,
) -> Telemetry:
    """Tracer and meter providers for one process.

    ``span_exporters`` (exported span by span, e.g. an InMemorySpanExporter) and
    ``metric_readers`` (e.g. an InMemoryMetricReader) are added to the chosen exporter — tests
    pass them with ``exporter="none"``. ``set_global`` installs the providers as OpenTelemetry's
    globals (once per process; later calls keep the first)."""
    global _global_installed
    chosen = resolve_exporter(exporter)
    if chosen == "none" and not span_exporters and not metric_readers:
        return Telemetry(service_name, "none", None, None)

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    attrs: dict[str, AttributeValue] = {"service.name": service_name}
    if service_version:
        attrs["service.version"] = service_version
    attrs.update(resource_attributes or {})
    resource = Resource.create(attrs)

    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = list(metric_readers)
    metric_exporter: MetricExporter | None = None
    if chosen == "console":
        # sys.stdout as it is now (the exporters' default is bound when they are imported)
        tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
        metric_exporter = ConsoleMetricExporter(out=sys.stdout)
    elif chosen == "otlp":
        span_exporter, metric_exporter = _otlp_exporters()
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if metric_exporter is not None:
        readers.append(PeriodicExportingMetricReader(metric_exporter, export_interval_millis=metric_export_interval_ms))
    for extra in span_exporters:
        tracer_provider.add_span_processor(SimpleSpanProcessor(extra))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)

    if set_global:
        if _global_installed:
            log.info("OpenTelemetry providers already installed in this process: keeping the first ones")
        else:
            trace.set_tracer_provider(tracer_provider)
            metrics.set_meter_provider(meter_provider)
            _global_installed = True
    return Telemetry(service_name, chosen, tracer_provider, meter_provider)


def _otlp_exporters() -> tuple[SpanExporter, MetricExporter]:
    """OTLP/HTTP exporters configured from the OTEL_EXPORTER_OTLP_* environment."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(), OTLPMetricExporter()


# --- trace context in message properties ---------------------------------------------------------
def inject_context(properties: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write the current (or given) span's W3C ``traceparent`` / ``tracestate`` into properties."""
    _PROPAGATOR.inject(properties, context=context)


def extract_context(properties: Mapping[str, str] | None) -> Context:
    """The producer's context carried by a message's properties (empty when there is none)."""
    if not properties or TRACEPARENT not in properties:
        return Context()
    return _PROPAGATOR.extract(properties)


def _split_topic(topic: str, tenant: str | None) -> tuple[str, str | None]:
    ns = tenant if tenant is not None else tenant_of(topic)
    if ns is not None and topic.startswith(ns + "%"):
        return topic[len(ns) + 1 :], ns
    return topic, ns


def _attributes(
    topic: str, tenant: str | None, operation_type: str, message_id: str | None
) -> tuple[str, dict[str, AttributeValue]]:
    """The destination's name (without namespace) and the span's attributes."""
    name, ns = _split_topic(topic, tenant)
    attrs: dict[str, AttributeValue] = {
        ATTR_SYSTEM: MESSAGING_SYSTEM,
        ATTR_DESTINATION: name,
        ATTR_OPERATION_TYPE: operation_type,
        ATTR_OPERATION_NAME: operation_type,
    }
    if ns is not None:
        attrs[ATTR_NAMESPACE] = ns
    if message_id:
        attrs[ATTR_MESSAGE_ID] = message_id
    return name, attrs


# --- spans --------------------------------------------------------------------------------------
def send_span(
    tel: Telemetry,
    topic: str,
    *,
    tenant: str | None = None,
    properties: MutableMapping[str, str] | None = None,
    message_id: str | None = None,
    tag: str | None = None,
    keys: Sequence[str] | None = None,
    batch_size: int | None = None,
    body_size: int | None = None,
) -> AbstractContextManager[Span]:
    """A PRODUCER span around a send; its context is injected into ``properties`` (before the
    message is encoded, so do it inside the ``with``). ``topic`` may be the wire form
    ``tenant%name``; the message id, known after the send, can be set on the span later
    (``span.set_attribute(ATTR_MESSAGE_ID, id)``)."""
    if not tel.enabled:
        return _NOOP_SPAN_CM
    name, attrs = _attributes(topic, tenant, OP_SEND, message_id)
    if tag:
        attrs[ATTR_TAG] = tag
    if keys:
        attrs[ATTR_KEYS] = list(keys)
    if batch_size is not None and batch_size != 1:
        attrs[ATTR_BATCH_COUNT] = batch_size
    if body_size is not None:
        attrs[ATTR_BODY_SIZE] = body_size
    return _producer(tel, f"{OP_SEND} {name}", attrs, properties)


@contextlib.contextmanager
def _producer(
    tel: Telemetry, name: str, attrs: dict[str, AttributeValue], properties: MutableMapping[str, str] | None
) -> Iterator[Span]:
    with tel.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attrs) as span:
        if properties is not None:
            inject_context(properties)
        yield span


def consume_span(
    tel: Telemetry,
    topic: str,
    *,
    properties: Mapping[str, str] | None,
    operation: ConsumeOperation = "process",
    tenant: str | None = None,
    consumer_group: str | None = None,
    message_id: str | None = None,
    as_child: bool = True,
) -> AbstractContextManager[Span]:
    """A span for receiving (CLIENT kind) or processing (CONSUMER kind) one message, linked to
    the producer's span found in ``properties``; with ``as_child`` (default) also its child,
    otherwise a child of the current span (a batch's receive span, say)."""
    if not tel.enabled:
        return _NOOP_SPAN_CM
    name, attrs = _attributes(topic, tenant, operation, message_id)
    if consumer_group:
        attrs[ATTR_CONSUMER_GROUP] = _split_topic(consumer_group, tenant)[0]
    ctx = extract_context(properties)
    producer = trace.get_current_span(ctx).get_span_context()
    links = [Link(producer)] if producer.is_valid else []
    return tel.tracer.start_as_current_span(
        f"{operation} {name}",
        context=ctx if (as_child and producer.is_valid) else None,
        kind=SpanKind.CONSUMER if operation == "process" else SpanKind.CLIENT,
        attributes=attrs,
        links=links,
    )


def messaging_attributes(
    topic: str,
    operation_type: str,
    *,
    tenant: str | None = None,
    message_id: str | None = None,
    consumer_group: str | None = None,
) -> tuple[str, dict[str, AttributeValue]]:
    """The destination's name (the topic without the namespace) and the messaging attributes a
    span about ``topic`` starts with (for spans built outside ``send_span`` / ``consume_span``)."""
    name, attrs = _attributes(topic, tenant, operation_type, message_id)
    if consumer_group:
        attrs[ATTR_CONSUMER_GROUP] = _split_topic(consumer_group, tenant)[0]
    return name, attrs


def end_request_span(span: Span, code: int, code_name: str, *, failed: bool) -> None:
    """End a broker's request span with the response code it answered (``orbit.response.code``);
    a failed request gets ``error.type`` (the code's name) and the ERROR status."""
    span.set_attribute(ATTR_RESPONSE_CODE, code)
    if failed:
        span.set_attribute(ATTR_ERROR_TYPE, code_name)
        span.set_status(StatusCode.ERROR, code_name)
    span.end()


def end_span_with_exception(span: Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_attribute(ATTR_ERROR_TYPE, type(error).__name__)
    span.set_status(StatusCode.ERROR, type(error).__name__)
    span.end()


def producer_links(properties: Sequence[Mapping[str, str] | None], limit: int = MAX_LINKS) -> list[Link]:
    """A link to each distinct producer span found in the messages' properties (at most ``limit``)."""
    links: list[Link] = []
    seen: set[tuple[int, int]] = set()
    for props in properties:
        if not props or TRACEPARENT not in props:
            continue
        sc = trace.get_current_span(_PROPAGATOR.extract(props)).get_span_context()
        if sc.is_valid and (sc.trace_id, sc.span_id) not in seen:
            seen.add((sc.trace_id, sc.span_id))
            links.append(Link(sc))
            if len(links) >= limit:
                break
    return links


def consume_batch_span(
    tel: Telemetry,
    topic: str,
    properties: Sequence[Mapping[str, str] | None],
    *,
    operation: ConsumeOperation = "process",
    tenant: str | None = None,
    consumer_group: str | None = None,
    message_id: str | None = None,
    as_child: bool = True,
    start_time: int | None = None,
    extra: Mapping[str, AttributeValue] | None = None,
) -> AbstractContextManager[Span]:
    """One span for the messages of one listener call or one poll (``properties``: each
    message's), linked to every producer span they carry.

    With ``as_child`` (push consumers) a single message's span is the child of its producer's
    span, as with ``consume_span``, and a batch's span starts a trace of its own (only linked:
    the messages may come from many traces). Without it (a poll's receive span) the parent is the
    current span. ``start_time`` (ns since the epoch) backdates the span: a poll's span is made
    once the poll has returned its messages. A batch of more than one message carries
    ``messaging.batch.message_count`` and no message id."""
    if not tel.enabled:
        return _NOOP_SPAN_CM
    n = len(properties)
    name, attrs = _attributes(topic, tenant, operation, message_id if n == 1 else None)
    if consumer_group:
        attrs[ATTR_CONSUMER_GROUP] = _split_topic(consumer_group, tenant)[0]
    if n != 1:
        attrs[ATTR_BATCH_COUNT] = n
    if extra:
        attrs.update(extra)
    links = producer_links(properties)
    ctx: Context | None = None
    if as_child:
        ctx = extract_context(properties[0]) if n == 1 and links else Context()
    return tel.tracer.start_as_current_span(
        f"{operation} {name}",
        context=ctx,
        kind=SpanKind.CONSUMER if operation == "process" else SpanKind.CLIENT,
        attributes=attrs,
        links=links,
        start_time=start_time,
    )


def parse_setting(value: str) -> ExporterName:
    """A ``telemetry`` setting ("none", "console" or "otlp", any case) checked; ValueError otherwise."""
    v = value.strip().lower()
    if v not in TELEMETRY_SETTINGS:
        raise ValueError(f"telemetry {value!r} is not one of none, console, otlp")
    return v


# --- broker metrics -----------------------------------------------------------------------------
class BrokerMetrics:
    """Messages and bytes in and out per tenant and topic, and the send latency, as OpenTelemetry
    instruments: ``orbit.broker.messages.in|out`` ({message}), ``orbit.broker.bytes.in|out``
    (By), ``orbit.broker.send.duration`` (s, histogram). Attribute sets are cached per
    (tenant, topic), at most ``max_attribute_sets`` of them (the cache restarts when full)."""

    __slots__ = ("_attrs", "_bytes_in", "_bytes_out", "_enabled", "_max", "_msgs_in", "_msgs_out", "_send_duration")

    def __init__(self, tel: Telemetry, *, max_attribute_sets: int = 10_000) -> None:
        self._enabled = tel.enabled
        self._max = max_attribute_sets
        self._attrs: dict[tuple[str | None, str], dict[str, AttributeValue]] = {}
        m = tel.meter
        self._msgs_in = m.create_counter("orbit.broker.messages.in", unit="{message}", description="messages stored")
        self._msgs_out = m.create_counter("orbit.broker.messages.out", unit="{message}", description="messages served")
        self._bytes_in = m.create_counter("orbit.broker.bytes.in", unit="By", description="message bytes stored")
        self._bytes_out = m.create_counter("orbit.broker.bytes.out", unit="By", description="message bytes served")
        self._send_duration = m.create_histogram(
            "orbit.broker.send.duration",
            unit="s",
            description="from a send request's arrival to its answer",
            explicit_bucket_boundaries_advisory=list(SEND_DURATION_BUCKETS_S),
        )

    def _attributes_of(self, tenant: str | None, topic: str) -> dict[str, AttributeValue]:
        key = (tenant, topic)
        a = self._attrs.get(key)
        if a is None:
            if len(self._attrs) >= self._max:
                self._attrs.clear()
            name, ns = _split_topic(topic, tenant)
            a = {ATTR_SYSTEM: MESSAGING_SYSTEM, ATTR_DESTINATION: name}
            if ns is not None:
                a[ATTR_NAMESPACE] = ns
            self._attrs[key] = a
        return a

    def messages_in(self, tenant: str | None, topic: str, msgs: int, nbytes: int) -> None:
        if not self._enabled:
            return
        a = self._attributes_of(tenant, topic)
        self._msgs_in.add(msgs, a)
        self._bytes_in.add(nbytes, a)

    def messages_out(self, tenant: str | None, topic: str, msgs: int, nbytes: int) -> None:
        if not self._enabled:
            return
        a = self._attributes_of(tenant, topic)
        self._msgs_out.add(msgs, a)
        self._bytes_out.add(nbytes, a)

    def send_latency(self, tenant: str | None, topic: str, seconds: float) -> None:
        if not self._enabled:
            return
        self._send_duration.record(seconds, self._attributes_of(tenant, topic))


# --- replication lag (docs/ha.md) ------------------------------------------------------------------
LagSource = Callable[[], "tuple[int, float] | None"]


def register_replication_lag(tel: Telemetry, lag: LagSource, *, broker_name: str) -> None:
    """``orbit.broker.replication.lag.bytes`` (By) and ``.seconds`` (s) as observable gauges:
    read from ``lag()`` — (bytes, seconds) of the slave furthest behind on a master, of this
    slave on a slave, or None (nothing to report) — whenever the metrics are collected."""
    if not tel.enabled or tel.meter_provider is None:
        return
    from opentelemetry.metrics import CallbackOptions, Observation

    attrs: dict[str, AttributeValue] = {"orbit.broker.name": broker_name}

    def observe(index: int) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(_options: CallbackOptions) -> list[Observation]:
            value = lag()
            if value is None or value[index] != value[index] or value[index] < 0:  # None, NaN, unknown
                return []
            return [Observation(value[index], attrs)]

        return callback

    m = tel.meter
    m.create_observable_gauge(
        "orbit.broker.replication.lag.bytes", callbacks=[observe(0)], unit="By",
        description="CommitLog bytes the slave furthest behind lacks (on a slave: this slave)",
    )  # fmt: skip
    m.create_observable_gauge(
        "orbit.broker.replication.lag.seconds", callbacks=[observe(1)], unit="s",
        description="store-time gap between the master's newest record and the slave's",
    )  # fmt: skip


def _register_counts(
    tel: Telemetry, name: str, counts: Mapping[str, int], *, key: str, broker_name: str, unit: str, description: str
) -> None:
    """An observable counter ``name`` read from ``counts`` (label → count) when metrics are
    collected, each count with its label as attribute ``key`` and the broker's name."""
    if not tel.enabled or tel.meter_provider is None:
        return
    from opentelemetry.metrics import CallbackOptions, Observation

    def callback(_options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"orbit.broker.name": broker_name, key: label}) for label, n in list(counts.items())]

    tel.meter.create_observable_counter(name, callbacks=[callback], unit=unit, description=description)


# --- inbound limits (data_plane/remoting/limits.py) --------------------------------------------------
def register_remoting_refusals(tel: Telemetry, refused: Mapping[str, int], *, broker_name: str) -> None:
    """``orbit.remoting.refused`` ({connection}): the connections the server's inbound limits
    closed, with the reason (the setting that refused them) as ``orbit.refusal.reason``."""
    _register_counts(
        tel, "orbit.remoting.refused", refused, key="orbit.refusal.reason", broker_name=broker_name,
        unit="{connection}",
        description="connections closed by the inbound limits (connections, incomplete frames), by reason",
    )  # fmt: skip


# --- forced deletions (data_plane/broker/forced_deletions.py) --------------------------------------
def register_forced_deletions(tel: Telemetry, messages: Mapping[str, int], *, broker_name: str) -> None:
    """``orbit.store.forced_deletion.messages`` ({message}): the messages the store deleted inside
    their retention at the disk's emergency watermark, with the tenant as
    ``messaging.rocketmq.namespace`` ("-" for topics outside every namespace)."""
    _register_counts(
        tel, "orbit.store.forced_deletion.messages", messages, key=ATTR_NAMESPACE, broker_name=broker_name,
        unit="{message}",
        description="messages deleted inside their retention at the disk's emergency watermark, by tenant",
    )  # fmt: skip


# --- the HA link's authentication (docs/ha.md, "The HA link") --------------------------------------
def register_ha_link_refusals(tel: Telemetry, refused: Mapping[str, int], *, broker_name: str) -> None:
    """``orbit.broker.ha.link.refused`` ({connection}): connections to the HA port that the link's
    authentication refused, with the reason (``no_secret``, ``bad_proof``, ``auth_timeout``,
    ``closed_in_auth``) as ``orbit.refusal.reason``."""
    _register_counts(
        tel, "orbit.broker.ha.link.refused", refused, key="orbit.refusal.reason", broker_name=broker_name,
        unit="{connection}",
        description="connections to the HA port refused by the link's authentication, by reason",
    )  # fmt: skip


# --- the broker's authorization (data_plane/broker/tenancy.py) -----------------------------------
def register_auth_refusals(tel: Telemetry, refused: Mapping[str, int], *, broker_name: str) -> None:
    """``orbit.broker.auth.refused`` ({request}): requests refused for their credentials
    (``credentials``), their grants (``permission``) or the stored record they name
    (``stored_record``), as ``orbit.refusal.reason``."""
    _register_counts(
        tel, "orbit.broker.auth.refused", refused, key="orbit.refusal.reason", broker_name=broker_name,
        unit="{request}", description="requests refused by authentication or authorization, by reason",
    )  # fmt: skip
