"""The control plane's telemetry: one SERVER span per request named after the route template, with
the HTTP semantic conventions' attributes and status code, the caller's traceparent continued,
request metrics by route, and never a credential in any attribute. In process (the real app over
the test PostgreSQL, an in-memory exporter) and as a process run with ``--telemetry console``."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from data_plane.telemetry import setup_telemetry
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    postgres_dsn_fixture,
    postgres_server_fixture,
    serve_control_plane,
)

pytestmark = pytest.mark.integration


class TracedControlPlane:
    def __init__(self, harness: ControlPlaneHarness, spans: InMemorySpanExporter, reader: InMemoryMetricReader) -> None:
        self.cp = harness
        self.spans = spans
        self.reader = reader

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())


@pytest_asyncio.fixture
async def traced(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[TracedControlPlane]:
    """The ``control_plane`` fixture's app, built with a Telemetry recording into memory."""
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tel = setup_telemetry(
        "orbit-control-plane-test", exporter="none", span_exporters=[spans], metric_readers=[reader], set_global=False
    )
    try:
        async with serve_control_plane(postgres_dsn, tmp_path, telemetry=tel) as harness:
            yield TracedControlPlane(harness, spans, reader)
    finally:
        tel.shutdown()


def all_attribute_text(spans: list[ReadableSpan]) -> str:
    """Every attribute, event and resource value of the spans, as one string."""
    parts: list[str] = []
    for s in spans:
        parts += [f"{k}={v!r}" for k, v in (s.attributes or {}).items()]
        for e in s.events:
            parts += [f"{k}={v!r}" for k, v in (e.attributes or {}).items()]
        parts += [f"{k}={v!r}" for k, v in s.resource.attributes.items()]
        parts.append(s.name)
    return "\n".join(parts)


@pytest.mark.asyncio
async def test_one_server_span_per_request_with_the_route_template_and_status(traced: TracedControlPlane) -> None:
    cp = traced.cp
    spans_at_start = len(traced.finished())
    assert spans_at_start == 1  # the fixture's POST /oauth/token
    (token_span,) = traced.finished()
    assert token_span.name == "POST /oauth/token"
    assert (token_span.attributes or {})["http.response.status_code"] == 200

    calls: list[tuple[str, str, int]] = []

    async def call(method: str, path: str, expect: int, **kw: Any) -> None:
        reply = await cp.call(method, path, **kw)
        assert reply.status == expect, reply.body
        calls.append((method, path, expect))

    await call("GET", "/healthz", 200)
    await call("POST", "/v1/tenants", 201, operator=True, json={"id": "acme"})
    await call("GET", "/v1/tenants/acme", 200, operator=True)
    await call("GET", "/v1/tenants/globex", 404, operator=True)
    await call("GET", "/v1/tenants", 401, token="not-a-token")
    await call("GET", "/no/such/thing", 404)
    parent_trace, parent_span = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    traceparent = f"00-{parent_trace:032x}-{parent_span:016x}-01"
    await call("GET", "/healthz", 200, headers={"traceparent": traceparent})
    credential, secret_token = await cp.new_tenant("globex")

    spans = traced.finished()[spans_at_start:]
    by_request = spans[: len(calls)]
    assert len(by_request) == len(calls)  # one span per request, in order
    expected_routes = ["/healthz", "/v1/tenants", "/v1/tenants/{tenant}", "/v1/tenants/{tenant}", "/v1/tenants", None]
    for span, (method, path, status), route in zip(by_request, calls, [*expected_routes, "/healthz"], strict=True):
        attrs = dict(span.attributes or {})
        assert span.kind is SpanKind.SERVER
        assert span.name == (f"{method} {route}" if route else method)
        assert attrs["http.request.method"] == method
        assert attrs["url.path"] == path
        assert attrs["url.scheme"] == "http"
        assert attrs.get("http.route") == route
        assert attrs["http.response.status_code"] == status
        assert span.status.status_code is StatusCode.UNSET  # 4xx is the client's error, not the server's
        assert "error.type" not in attrs
    continued = by_request[-1]
    assert continued.parent is not None
    assert (continued.parent.trace_id, continued.parent.span_id) == (parent_trace, parent_span)
    assert continued.context is not None
    assert continued.context.trace_id == parent_trace
    assert by_request[0].parent is None

    # No credential anywhere: not the operator's token or secret, not the tenant's.
    text = all_attribute_text(traced.finished())
    basic = base64.b64encode(f"{cp.operator_access_key}:{cp.operator_secret}".encode()).decode()
    for secret in (cp.operator_token, cp.operator_secret, basic, "not-a-token", credential["secret"], secret_token):
        assert secret not in text
    assert "Bearer" not in text
    assert "Basic" not in text
    assert "authorization" not in text.lower()

    # Metrics by method, route and status.
    data = traced.reader.get_metrics_data()
    assert data is not None
    durations: dict[tuple[object, object, object], int] = {}
    counts: dict[tuple[object, object, object], float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    a = p.attributes or {}
                    key = (a.get("http.request.method"), a.get("http.route"), a.get("http.response.status_code"))
                    if metric.name == "http.server.request.duration":
                        assert isinstance(p, HistogramDataPoint)
                        durations[key] = p.count
                        assert metric.unit == "s"
                    elif metric.name == "orbit.control_plane.requests":
                        assert isinstance(p, NumberDataPoint)
                        counts[key] = p.value
    assert durations[("GET", "/healthz", 200)] == 2
    assert durations[("GET", "/v1/tenants/{tenant}", 404)] == 1
    assert durations[("GET", None, 404)] == 1
    assert counts == {k: float(v) for k, v in durations.items()}


def _start(args: list[str], workdir: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    ready = workdir / "ready.json"
    log_path = workdir / "control-plane.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "ORBIT_", "OTEL_"))}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane", "--listen", "127.0.0.1:0", "--ready-file", str(ready), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(log_path.read_text())
        time.sleep(0.05)  # deadline poll for the ready file
    return proc, orjson.loads(ready.read_bytes())["url"], log_path


@pytest.mark.asyncio
async def test_the_process_with_console_telemetry_prints_its_spans(postgres_dsn: str, tmp_path: Path) -> None:
    workdir = tmp_path
    bootstrap = workdir / "operator.json"
    proc, url, log_path = _start(
        [
            "--database-url",
            postgres_dsn,
            "--master-key-file",
            str(workdir / "master.key"),
            "--bootstrap-credentials-file",
            str(bootstrap),
            "--reconcile-interval-s",
            "0",
            "--telemetry",
            "console",
        ],
        workdir,
    )
    try:
        operator = orjson.loads(bootstrap.read_bytes())
        basic = base64.b64encode(f"{operator['access_key']}:{operator['secret']}".encode()).decode()
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/healthz") as resp:
                assert resp.status == 200
            async with session.post(
                url + "/oauth/token",
                data={"grant_type": "client_credentials"},
                headers={"Authorization": f"Basic {basic}"},
            ) as resp:
                assert resp.status == 200
                token = (await resp.json())["access_token"]
            async with session.get(url + "/v1/tenants/acme", headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    log = log_path.read_text()
    assert '"name": "GET /healthz"' in log
    assert '"name": "POST /oauth/token"' in log
    assert '"http.route": "/v1/tenants/{tenant}"' in log
    assert '"http.response.status_code": 404' in log
    assert '"service.name": "orbit-control-plane"' in log
    assert '"http.server.request.duration"' in log  # the metrics, flushed at shutdown
    for secret in (token, operator["secret"], basic):
        assert secret not in log
    assert "Traceback" not in log
