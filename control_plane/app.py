"""The aiohttp application factory.

``create_app(settings)`` owns its pool (opened, migrated and bootstrapped in ``cleanup_ctx``);
``create_app(settings, services=...)`` serves services the caller owns (tests, embedding).
The app prunes brokers' load samples past ``settings.load_history_hours`` in the background.
With ``settings.reconcile_interval_s`` > 0 the app also runs the reconciler, and every
successful change through the API (a non-GET under /v1/ answered 2xx) or the web console (a
form under /console/t/ or /console/ops/ answered 200 or 303) starts a round at once.

Telemetry (``settings.telemetry`` "console" | "otlp", or ``create_app(..., telemetry=tel)``): the
outermost middleware makes a SERVER span per request and records the request counter and
duration histogram (``telemetry_middleware``). Off ("none", the default) it is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from control_plane import console
from control_plane.auth import MAX_TOKEN_CHARS
from control_plane.autoscaler import Autoscaler
from control_plane.context import AUTOSCALER, LOGIN_LIMITER, OPENAPI, RECONCILER, SERVICES
from control_plane.handlers import credentials, endpoints, fleet, groups, ha, load, public, tenants, topics, usage
from control_plane.load_view import SampledLoad
from control_plane.login_limiter import LoginLimiter
from control_plane.middleware import error_middleware
from control_plane.openapi import build_document
from control_plane.queue_drain import BrokerDrainCheck
from control_plane.reconcile_source import ServicesStateSource
from control_plane.reconciler import Reconciler
from control_plane.routes import Route
from control_plane.scaling_policy import ScalingSettings
from control_plane.services import Services, open_services
from control_plane.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from data_plane.telemetry import Telemetry

MAX_HEADER_VALUE_BYTES = 2 * MAX_TOKEN_CHARS
ALL_ROUTES: list[Route] = [
    *public.ROUTES,
    *tenants.ROUTES,
    *fleet.ROUTES,
    *topics.ROUTES,
    *groups.ROUTES,
    *credentials.ROUTES,
    *usage.ROUTES,
    *load.ROUTES,
    *ha.ROUTES,
    *endpoints.ROUTES,
]


def create_app(
    settings: Settings, *, services: Services | None = None, telemetry: Telemetry | None = None
) -> web.Application:
    """``telemetry``: the caller's (it shuts it down); without it one is made from
    ``settings.telemetry`` unless that is "none", and shut down with the app."""
    middlewares: list[Middleware] = [kick_reconciler_middleware, error_middleware]
    owned: Telemetry | None = None
    if telemetry is None and settings.telemetry != "none":
        from data_plane.telemetry import parse_setting, setup_telemetry

        telemetry = owned = setup_telemetry("orbit-control-plane", exporter=parse_setting(settings.telemetry))
    if telemetry is not None and telemetry.enabled:
        middlewares.insert(0, telemetry_middleware(telemetry))  # outermost: sees the final status
    # aiohttp's own limits sit above ours, so a body or a bearer token just past the limit gets
    # our clear message (aiohttp answers a header value past its limit before any middleware).
    app = web.Application(
        middlewares=middlewares,
        client_max_size=settings.json_body_limit_bytes + 1,
        handler_args={"max_field_size": MAX_HEADER_VALUE_BYTES},
    )
    if owned is not None:
        tel = owned

        async def shutdown_telemetry(app: web.Application) -> None:
            await asyncio.to_thread(tel.shutdown)  # flushes the last spans and metrics

        app.on_cleanup.append(shutdown_telemetry)
    for route in ALL_ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    app[OPENAPI] = build_document(ALL_ROUTES)
    console.setup(app, settings.master_key.value)
    app[LOGIN_LIMITER] = LoginLimiter()
    if services is not None:
        app[SERVICES] = services
    else:

        async def services_ctx(app: web.Application) -> AsyncIterator[None]:
            async with open_services(settings) as opened:
                app[SERVICES] = opened
                yield

        app.cleanup_ctx.append(services_ctx)
    if settings.reconcile_interval_s > 0:
        app.cleanup_ctx.append(reconciler_ctx)
    app.cleanup_ctx.append(load_pruning_ctx)
    if settings.autoscale_interval_s > 0:
        app.cleanup_ctx.append(autoscaler_ctx)
    return app


async def autoscaler_ctx(app: web.Application) -> AsyncIterator[None]:
    """Topics' queues follow their load (docs/elasticity.md); a change kicks the reconciler."""
    services = app[SERVICES]
    s = services.settings
    source = ServicesStateSource(services)

    def changed() -> None:
        reconciler = app.get(RECONCILER)
        if reconciler is not None:
            reconciler.kick()

    autoscaler = Autoscaler(
        services.pool,
        SampledLoad(services.pool),
        BrokerDrainCheck(services, source.operator_token),
        ScalingSettings(queue_capacity_msgs_per_s=s.queue_capacity_msgs_per_s, shrink_after_s=s.scale_down_after_s),
        interval_s=s.autoscale_interval_s,
        window_s=s.scale_window_s,
        on_change=changed,
    )
    app[AUTOSCALER] = autoscaler
    autoscaler.start()
    yield
    await autoscaler.close()


async def load_pruning_ctx(app: web.Application) -> AsyncIterator[None]:
    """Brokers' load samples older than ``load_history_hours`` are deleted every ``load_prune_interval_s``."""
    services = app[SERVICES]
    task = asyncio.get_running_loop().create_task(
        services.load.prune_every(services.settings.load_prune_interval_s), name="load-pruning"
    )
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def reconciler_ctx(app: web.Application) -> AsyncIterator[None]:
    source = ServicesStateSource(app[SERVICES])
    reconciler = Reconciler(source, source.operator_token, interval_s=app[SERVICES].settings.reconcile_interval_s)
    app[RECONCILER] = reconciler
    reconciler.start()
    yield
    await reconciler.close()


@web.middleware
async def kick_reconciler_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if request.method != "GET" and _changed(request, response):
        reconciler = request.app.get(RECONCILER)
        if reconciler is not None:
            reconciler.kick()
    return response


def _changed(request: web.Request, response: web.StreamResponse) -> bool:
    """A successful change: an API call answered 2xx, or a console form answered with its
    redirect (303 See Other) or its result page (200: a new credential's secret)."""
    if request.path.startswith("/v1/"):
        return 200 <= response.status < 300
    return request.path.startswith(("/console/t/", "/console/ops/")) and response.status in (200, 303)


# --- telemetry ------------------------------------------------------------------------------------
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
# The HTTP semantic conventions' advice for http.server.request.duration (seconds).
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TRACE_HEADERS = ("traceparent", "tracestate")


def route_template(request: web.Request) -> str | None:
    """The matched route's template (``/v1/tenants/{tenant_id}``), None when no route matched."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def telemetry_middleware(tel: Telemetry) -> Middleware:
    """A SERVER span ``"{method} {route}"`` per request (the child of a W3C ``traceparent``
    header's span, if any) with ``http.request.method``, ``url.path``, ``url.scheme``,
    ``http.route``, ``http.response.status_code`` (5xx: ERROR status and ``error.type``);
    ``http.server.request.duration`` (s) and ``orbit.control_plane.requests`` by method, route and
    status. No header other than traceparent/tracestate is read and no query string is kept:
    tokens and credentials never reach the telemetry."""
    from opentelemetry.trace import SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = tel.tracer
    propagator = TraceContextTextMapPropagator()
    duration = tel.meter.create_histogram(
        "http.server.request.duration",
        unit="s",
        description="duration of HTTP server requests",
        explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
    )
    requests = tel.meter.create_counter(
        "orbit.control_plane.requests", unit="{request}", description="HTTP requests answered"
    )

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        began = time.perf_counter()
        method = request.method if request.method in HTTP_METHODS else "_OTHER"
        route = route_template(request)
        attrs: dict[str, AttributeValue] = {
            "http.request.method": method,
            "url.path": request.path,
            "url.scheme": request.scheme,
        }
        if route is not None:
            attrs["http.route"] = route
        carrier = {h: v for h in _TRACE_HEADERS if (v := request.headers.get(h)) is not None}
        parent = propagator.extract(carrier) if carrier else None
        status: int | None = None
        error_type: str | None = None
        with tracer.start_as_current_span(
            f"{method} {route}" if route is not None else method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attrs,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as e:  # what error_middleware lets through (redirects)
                status = e.status
                raise
            except BaseException as e:
                error_type = type(e).__name__
                raise
            finally:
                metric_attrs: dict[str, AttributeValue] = {"http.request.method": method}
                if route is not None:
                    metric_attrs["http.route"] = route
                if status is not None:
                    span.set_attribute("http.response.status_code", status)
                    metric_attrs["http.response.status_code"] = status
                    if status >= 500:
                        error_type = str(status)
                if error_type is not None:
                    span.set_attribute("error.type", error_type)
                    span.set_status(StatusCode.ERROR, error_type)
                    metric_attrs["error.type"] = error_type
                duration.record(time.perf_counter() - began, metric_attrs)
                requests.add(1, metric_attrs)

    return middleware
