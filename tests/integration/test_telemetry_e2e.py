"""OpenTelemetry end to end over real name server and broker processes: the producer's send span
travels in the message's properties to the push consumer's process span (its child, same trace),
batches link to every producer span, a pull consumer's poll makes a linked receive span, a failed
send is an error span, and a broker run with ``--set telemetry=console`` serves and prints spans
that continue the producer's trace and its metrics."""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from data_plane.telemetry import Telemetry, setup_telemetry
from sdk import ConsumeResult, Message, MessageExt, OrbitError, Producer, PullConsumer, PushConsumer
from tests.integration import helpers
from tests.integration.helpers import QUICK, create_topic

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0
until = functools.partial(helpers.until, timeout_s=DEADLINE_S)
TOPIC = "acme%orders"


class Traced:
    """A Telemetry recording into memory, as the application under test would pass it."""

    def __init__(self, service: str) -> None:
        self.spans = InMemorySpanExporter()
        self.tel: Telemetry = setup_telemetry(service, exporter="none", span_exporters=[self.spans], set_global=False)

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]


@pytest.fixture
def producer_side() -> Iterator[Traced]:
    t = Traced("orbit-test-producer")
    yield t
    t.tel.shutdown()


@pytest.fixture
def consumer_side() -> Iterator[Traced]:
    t = Traced("orbit-test-consumer")
    yield t
    t.tel.shutdown()


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


@pytest.mark.asyncio
async def test_the_process_span_is_the_child_of_the_send_span(
    namesrv_addr: str, producer_side: Traced, consumer_side: Traced
) -> None:
    await create_topic(namesrv_addr, TOPIC, 2)
    got: list[MessageExt] = []
    consumer = PushConsumer(
        "acme%billing", namesrv_addrs=namesrv_addr, instance_name="c", telemetry=consumer_side.tel, **QUICK
    )
    consumer.subscribe(TOPIC)

    @consumer.on_message
    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        got.extend(msgs)
        return ConsumeResult.SUCCESS

    msg = Message(TOPIC, b"order 42", tags="paid", keys="order-42", properties={"origin": "web"})
    async with Producer(
        "acme%checkout", namesrv_addrs=namesrv_addr, instance_name="p", telemetry=producer_side.tel
    ) as p:
        await consumer.start()
        try:
            result = await p.send(msg)
            await until(lambda: bool(consumer_side.named("process orders")), "the process span")
        finally:
            await consumer.shutdown()

    assert msg.properties == {"origin": "web"}  # the caller's message is not changed
    (send,) = producer_side.named("send orders")
    assert send.kind is SpanKind.PRODUCER
    assert send.status.status_code is StatusCode.UNSET
    assert dict(send.attributes or {}) == {
        "messaging.system": "rocketmq",
        "messaging.destination.name": "orders",
        "messaging.rocketmq.namespace": "acme",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": result.msg_id,
        "messaging.rocketmq.message.tag": "paid",
        "messaging.rocketmq.message.keys": ("order-42",),
        "messaging.message.body.size": 8,
        "messaging.destination.partition.id": str(result.message_queue.queue_id),
    }

    # The trace context crossed the broker as two string properties, next to the user's own.
    (m,) = got
    trace_id, span_id = ids(send)
    version, carried_trace, carried_span, flags = m.properties["traceparent"].split("-")
    assert (version, carried_trace, carried_span) == ("00", f"{trace_id:032x}", f"{span_id:016x}")
    assert int(flags, 16) & 1  # sampled
    assert m.properties["origin"] == "web"
    assert m.tags == "paid"
    assert m.msg_id == result.msg_id

    (process,) = consumer_side.named("process orders")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None
    assert (process.parent.trace_id, process.parent.span_id) == (trace_id, span_id)
    assert ids(process)[0] == trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [(trace_id, span_id)]
    attrs = dict(process.attributes or {})
    assert attrs["messaging.system"] == "rocketmq"
    assert attrs["messaging.destination.name"] == "orders"
    assert attrs["messaging.rocketmq.namespace"] == "acme"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.message.id"] == result.msg_id
    assert attrs["messaging.consumer.group.name"] == "billing"
    assert attrs["messaging.rocketmq.consumption_model"] == "clustering"
    assert attrs["messaging.destination.partition.id"] == str(m.queue_id)
    assert process.status.status_code is StatusCode.UNSET


@pytest.mark.asyncio
async def test_a_batch_listener_call_links_to_each_producer_span(
    namesrv_addr: str, producer_side: Traced, consumer_side: Traced
) -> None:
    await create_topic(namesrv_addr, TOPIC, 1)  # one queue: the consumer gets the five together
    async with Producer(
        "acme%checkout", namesrv_addrs=namesrv_addr, instance_name="p", telemetry=producer_side.tel
    ) as p:
        for i in range(3):
            await p.send(Message(TOPIC, f"m{i}".encode()))
        await p.send_batch([Message(TOPIC, b"b1"), Message(TOPIC, b"b2")])  # one span, one context

    calls: list[int] = []
    consumer = PushConsumer(
        "acme%billing",
        namesrv_addrs=namesrv_addr,
        instance_name="c",
        telemetry=consumer_side.tel,
        consume_batch_size=10,
        reconsume_delay_ms=100,
        **QUICK,
    )
    consumer.subscribe(TOPIC)

    @consumer.on_message
    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        calls.append(len(msgs))
        return ConsumeResult.RECONSUME_LATER if len(calls) == 1 else ConsumeResult.SUCCESS

    await consumer.start()
    try:
        await until(lambda: consumer.consumed_count >= 5, "five messages consumed")
    finally:
        await consumer.shutdown()
    # The five come back from the retry topic in one call, or split when their re-puts landed in
    # different schedule ticks.
    assert calls[0] == 5
    assert sum(calls[1:]) == 5

    sends = producer_side.named("send orders")
    assert len(sends) == 4
    (batch_send,) = [s for s in sends if (s.attributes or {}).get("messaging.batch.message_count") == 2]
    assert "messaging.message.id" not in (batch_send.attributes or {})

    first, *again = sorted(consumer_side.named("process orders"), key=lambda s: s.start_time or 0)
    assert len(again) == len(calls) - 1
    linked_again: set[tuple[int, int]] = set()
    for span, n in zip((first, *again), calls, strict=True):
        attrs = dict(span.attributes or {})
        links = {(link.context.trace_id, link.context.span_id) for link in span.links}
        assert links <= {ids(s) for s in sends}
        if n == 1:  # a retry call split down to one message: the child of that message's producer span
            assert span.parent is not None
            assert {(span.parent.trace_id, span.parent.span_id)} == links
            assert "messaging.batch.message_count" not in attrs
        else:  # messages of several traces: a trace of its own, linked to each
            assert span.parent is None
            assert attrs["messaging.batch.message_count"] == n
        if span is not first:
            linked_again |= links
        if n > 1:
            assert "messaging.message.id" not in attrs
    assert {(link.context.trace_id, link.context.span_id) for link in first.links} == {ids(s) for s in sends}
    assert linked_again == {ids(s) for s in sends}  # every producer's span, across the retry calls
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "RECONSUME_LATER"
    assert all(span.status.status_code is StatusCode.UNSET for span in again)


@pytest.mark.asyncio
async def test_a_poll_makes_a_receive_span_linked_to_the_producers(
    namesrv_addr: str, producer_side: Traced, consumer_side: Traced
) -> None:
    await create_topic(namesrv_addr, TOPIC, 1)
    async with Producer(
        "acme%checkout", namesrv_addrs=namesrv_addr, instance_name="p", telemetry=producer_side.tel
    ) as p:
        for i in range(2):
            await p.send(Message(TOPIC, f"m{i}".encode()))
    consumer = PullConsumer(
        "acme%reports", namesrv_addrs=namesrv_addr, instance_name="c", telemetry=consumer_side.tel, **QUICK
    )
    consumer.subscribe(TOPIC)
    await consumer.start()
    polled: list[MessageExt] = []
    try:
        with consumer_side.tel.tracer.start_as_current_span("poll loop") as loop_span:
            while len(polled) < 2:
                polled += await consumer.poll(timeout_ms=5000)
            assert await consumer.poll(timeout_ms=50) == []  # an empty poll makes no span
    finally:
        await consumer.shutdown()

    receives = consumer_side.named("receive orders")
    assert 1 <= len(receives) <= 2
    linked: set[tuple[int, int]] = set()
    for r in receives:
        assert r.kind is SpanKind.CLIENT
        assert r.parent is not None
        assert r.parent.span_id == loop_span.get_span_context().span_id
        attrs = dict(r.attributes or {})
        assert attrs["messaging.operation.type"] == "receive"
        assert attrs["messaging.consumer.group.name"] == "reports"
        assert (r.end_time or 0) >= (r.start_time or 0)
        linked |= {(link.context.trace_id, link.context.span_id) for link in r.links}
    assert linked == {ids(s) for s in producer_side.named("send orders")}


@pytest.mark.asyncio
async def test_a_failed_send_is_an_error_span(namesrv: ServerProcess, producer_side: Traced) -> None:
    # A name server without brokers: the topic has no route.
    async with Producer(
        "acme%checkout",
        namesrv_addrs=namesrv.address,
        instance_name="p",
        telemetry=producer_side.tel,
        send_timeout_ms=500,
    ) as p:
        with pytest.raises(OrbitError):
            await p.send(Message(TOPIC, b"x"))
    (send,) = producer_side.named("send orders")
    assert send.status.status_code is StatusCode.ERROR
    error_type = (send.attributes or {})["error.type"]
    assert isinstance(error_type, str)
    assert error_type.endswith("Error")
    assert any(e.name == "exception" for e in send.events)


@pytest.mark.asyncio
async def test_a_broker_with_console_telemetry_serves_and_continues_the_trace(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], producer_side: Traced
) -> None:
    broker = start_broker(namesrv.address, "--set", "telemetry=console")
    await create_topic(namesrv.address, TOPIC, 1)
    async with Producer(
        "acme%checkout", namesrv_addrs=namesrv.address, instance_name="p", telemetry=producer_side.tel
    ) as p:
        sent = [await p.send(Message(TOPIC, f"m{i}".encode())) for i in range(3)]
    consumer = PullConsumer("acme%reports", namesrv_addrs=namesrv.address, instance_name="c", **QUICK)
    consumer.subscribe(TOPIC)
    await consumer.start()
    polled: list[MessageExt] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(polled) < 3 and time.monotonic() < deadline:
            polled += await consumer.poll(timeout_ms=1000)
    finally:
        await consumer.shutdown()
    assert sorted(m.msg_id for m in polled) == sorted(r.msg_id for r in sent)
    assert broker.stop() == 0  # a clean shutdown flushes the last spans and metrics

    log = broker.log_text()
    assert "Traceback" not in log
    assert not re.search(r" (ERROR|CRITICAL) ", log), log[-3000:]
    assert "telemetry on (console)" in log
    assert log.count('"name": "send orders"') == 3
    spans = _console_spans(log)
    broker_sends = [s for s in spans if s["name"] == "send orders"]
    assert broker_sends
    producer_traces = {f"0x{ids(s)[0]:032x}" for s in producer_side.named("send orders")}
    assert {s["context"]["trace_id"] for s in broker_sends} <= producer_traces  # the producer's traces go on
    for s in broker_sends:
        assert s["kind"] == "SpanKind.SERVER"
        assert s["attributes"]["messaging.system"] == "rocketmq"
        assert s["attributes"]["messaging.rocketmq.namespace"] == "acme"
        assert s["resource"]["attributes"]["service.name"] == "orbit-broker"
    assert {s["parent_id"] for s in broker_sends} <= {f"0x{ids(s)[1]:016x}" for s in producer_side.named("send orders")}
    assert '"name": "receive orders"' in log
    for s in spans:
        if s["name"] == "receive orders":
            assert s["attributes"]["messaging.consumer.group.name"] == "reports"
            assert s["attributes"]["messaging.batch.message_count"] >= 1
    assert '"orbit.broker.messages.in"' in log
    assert '"orbit.broker.send.duration"' in log


def _console_spans(log: str) -> list[dict[str, Any]]:
    """The spans the console exporter printed: JSON objects from a line "{" to a line "}". One
    that a log line (stderr, the same file) cut in two is skipped."""
    spans: list[dict[str, Any]] = []
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        if lines[i] == "{" and "}" in lines[i:]:
            j = lines.index("}", i)
            try:
                doc = json.loads("\n".join(lines[i : j + 1]))
            except ValueError:
                doc = {}
            if "context" in doc and "name" in doc:
                spans.append(doc)
            i = j + 1
        else:
            i += 1
    return spans
