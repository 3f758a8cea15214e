"""The broker's telemetry in process: a real name server and broker on one event loop with the
SDK's producer and pull consumer, the broker's Telemetry recording into memory. Send spans
continue the producer's trace (a batch links to its producer), pulls that served messages make
receive spans, refusals are error spans, and the counters and the latency histogram count per
tenant and topic — under ASYNC_FLUSH (answered at once) and SYNC_FLUSH (answered later). Off,
the broker registers its plain handlers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from data_plane.broker.broker import Broker
from data_plane.broker.config import BrokerConfig, ConfigError
from data_plane.broker.pull import PullProcessor
from data_plane.broker.send import SendProcessor
from data_plane.namesrv.server import NameServer
from data_plane.remoting.codes import RequestCode
from data_plane.store import fastpath
from data_plane.telemetry import Telemetry, setup_telemetry
from sdk import Message, MessageExt, OrbitError, Producer, PullConsumer

pytestmark = pytest.mark.integration

SMALL_STORE: dict[str, Any] = {
    "commit_log_file_size_bytes": 16 << 20,
    "reserve_ahead_bytes": 0,
    "index_hash_slots": 65536,
    "index_max_entries": 262144,
}


@dataclass
class Recorded:
    tel: Telemetry
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader | None = None

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]


@pytest.fixture
def broker_side() -> Iterator[Recorded]:
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tel = setup_telemetry(
        "orbit-broker-test", exporter="none", span_exporters=[spans], metric_readers=[reader], set_global=False
    )
    yield Recorded(tel, spans, reader)
    tel.shutdown()


@pytest.fixture
def client_side() -> Iterator[Recorded]:
    spans = InMemorySpanExporter()
    tel = setup_telemetry("orbit-client-test", exporter="none", span_exporters=[spans], set_global=False)
    yield Recorded(tel, spans)
    tel.shutdown()


@pytest_asyncio.fixture
async def namesrv() -> AsyncIterator[NameServer]:
    ns = NameServer()
    await ns.start()
    try:
        yield ns
    finally:
        await ns.close()


async def start_broker(ns: NameServer, store_dir: Path, telemetry: Telemetry | None, flush: str) -> Broker:
    config = BrokerConfig(
        listen="127.0.0.1:0",
        namesrv_addrs=(ns.address,),
        store_dir=str(store_dir),
        store={**SMALL_STORE, "flush_disk_type": flush},
    ).validate()
    broker = Broker(config, telemetry=telemetry)
    await broker.start()
    return broker


def points(reader: InMemoryMetricReader) -> dict[tuple[str, str, str], NumberDataPoint | HistogramDataPoint]:
    """(instrument, tenant, topic name) → its data point."""
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[tuple[str, str, str], NumberDataPoint | HistogramDataPoint] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    a = p.attributes or {}
                    key = (
                        metric.name,
                        str(a.get("messaging.rocketmq.namespace")),
                        str(a["messaging.destination.name"]),
                    )
                    out[key] = p  # type: ignore[assignment]
    return out


def value(p: NumberDataPoint | HistogramDataPoint) -> float:
    assert isinstance(p, NumberDataPoint)
    return p.value


@pytest.mark.asyncio
@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_the_broker_traces_and_counts_sends_and_pulls(
    namesrv: NameServer, tmp_path: Path, broker_side: Recorded, client_side: Recorded, flush: str
) -> None:
    broker = await start_broker(namesrv, tmp_path / "broker", broker_side.tel, flush)
    try:
        # every send through the traced handler: no frame path passing by it
        assert broker.processors.frame_handler is None
        async with Producer("acme%p", namesrv_addrs=namesrv.address, telemetry=client_side.tel) as producer:
            for topic in ("acme%orders", "globex%orders"):
                await producer.create_topic(topic, queue_nums=1)
            singles = [await producer.send(Message("acme%orders", b"a" * 10)) for _ in range(3)]
            await producer.send(Message("globex%orders", b"g" * 20))
            batch = await producer.send_batch([Message("acme%orders", b"b1"), Message("acme%orders", b"b2")])
        consumer = PullConsumer(
            "acme%reports", namesrv_addrs=namesrv.address, consume_from="FIRST_OFFSET", rebalance_interval_ms=500
        )
        consumer.subscribe("acme%orders")
        await consumer.start()
        polled: list[MessageExt] = []
        try:
            deadline = time.monotonic() + 30
            while len(polled) < 5 and time.monotonic() < deadline:
                polled += await consumer.poll(timeout_ms=1000)
        finally:
            await consumer.shutdown()
        assert sorted(m.msg_id for m in polled) == sorted([r.msg_id for r in singles] + batch.msg_ids)
    finally:
        await broker.shutdown()

    # Spans: each send continues its producer's trace.
    client_sends = client_side.named("send orders")
    broker_sends = broker_side.named("send orders")
    assert len(client_sends) == len(broker_sends) == 5
    by_span_id = {s.context.span_id: s for s in client_sends if s.context is not None}
    for s in broker_sends:
        assert s.kind is SpanKind.SERVER
        assert s.parent is not None
        producer_span = by_span_id[s.parent.span_id]
        assert s.context is not None
        assert producer_span.context is not None
        assert s.context.trace_id == producer_span.context.trace_id
        assert s.status.status_code is StatusCode.UNSET
        attrs = dict(s.attributes or {})
        assert attrs["messaging.system"] == "rocketmq"
        assert attrs["messaging.operation.type"] == "send"
        assert attrs["orbit.response.code"] == 0
        assert attrs["messaging.destination.partition.id"] == "0"
        if attrs.get("messaging.batch.message_count") == 2:
            assert [link.context.span_id for link in s.links] == [s.parent.span_id]
        else:
            assert attrs["messaging.message.id"] == (producer_span.attributes or {})["messaging.message.id"]
    assert sum(1 for s in broker_sends if (s.attributes or {}).get("messaging.batch.message_count") == 2) == 1

    receives = broker_side.named("receive orders")
    assert receives
    served = 0
    for r in receives:
        attrs = dict(r.attributes or {})
        assert r.kind is SpanKind.SERVER
        assert r.parent is None
        assert attrs["messaging.consumer.group.name"] == "reports"
        assert attrs["messaging.rocketmq.namespace"] == "acme"
        n = attrs["messaging.batch.message_count"]
        assert isinstance(n, int)
        served += n
    assert served >= 5

    # Metrics per tenant and topic.
    assert broker_side.metrics is not None
    got = points(broker_side.metrics)
    assert value(got[("orbit.broker.messages.in", "acme", "orders")]) == 5
    assert value(got[("orbit.broker.messages.in", "globex", "orders")]) == 1
    assert value(got[("orbit.broker.bytes.in", "acme", "orders")]) > 3 * 10 + 2 * 2
    assert value(got[("orbit.broker.messages.out", "acme", "orders")]) >= 5
    assert ("orbit.broker.messages.out", "globex", "orders") not in got
    hist = got[("orbit.broker.send.duration", "acme", "orders")]
    assert isinstance(hist, HistogramDataPoint)
    assert hist.count == 4  # three sends and a batch
    assert 0 < hist.sum < 30


@pytest.mark.asyncio
async def test_a_refused_send_is_an_error_span(
    namesrv: NameServer, tmp_path: Path, broker_side: Recorded, client_side: Recorded
) -> None:
    broker = await start_broker(namesrv, tmp_path / "broker", broker_side.tel, "ASYNC_FLUSH")
    try:
        async with Producer("acme%p", namesrv_addrs=namesrv.address, telemetry=client_side.tel) as producer:
            await producer.create_topic("acme%readonly", queue_nums=1, perm=4)
            with pytest.raises(OrbitError):
                await producer.send(Message("acme%readonly", b"x"))
    finally:
        await broker.shutdown()
    refused = broker_side.named("send readonly")
    assert refused
    for s in refused:
        assert s.status.status_code is StatusCode.ERROR
        assert (s.attributes or {})["error.type"] == "NO_PERMISSION"
    (client,) = client_side.named("send readonly")
    assert client.status.status_code is StatusCode.ERROR
    assert broker_side.metrics is not None
    hist = points(broker_side.metrics)[("orbit.broker.send.duration", "acme", "readonly")]
    assert isinstance(hist, HistogramDataPoint)
    assert hist.count == len(refused)


@pytest.mark.asyncio
async def test_off_the_broker_registers_its_plain_handlers(namesrv: NameServer, tmp_path: Path) -> None:
    broker = await start_broker(namesrv, tmp_path / "broker", None, "ASYNC_FLUSH")
    try:
        assert broker.telemetry is None
        assert broker.metrics is None
        handlers = broker.processors.handlers
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            assert isinstance(getattr(handlers[code], "__self__", None), SendProcessor)
        assert isinstance(getattr(handlers[RequestCode.PULL_MESSAGE], "__self__", None), PullProcessor)
        # and the plain single send answered straight from its frame, when the appender is compiled
        frame_handler = broker.processors.frame_handler
        if fastpath.COMPILED:
            assert isinstance(getattr(frame_handler, "__self__", None), SendProcessor)
            assert getattr(frame_handler, "__name__", "") == "send_frame"
        else:
            assert frame_handler is None
    finally:
        await broker.shutdown()


def test_the_telemetry_setting_is_checked() -> None:
    assert BrokerConfig().telemetry == "none"
    assert BrokerConfig(telemetry="otlp").validate().telemetry == "otlp"
    with pytest.raises(ConfigError, match="telemetry 'jaeger' is not one of none, console, otlp"):
        BrokerConfig(telemetry="jaeger").validate()
