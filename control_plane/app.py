"""The aiohttp application factory.

``create_app(settings)`` owns its pool (opened, migrated and bootstrapped in ``cleanup_ctx``);
``create_app(settings, services=...)`` serves services the caller owns (tests, embedding).
With ``settings.reconcile_interval_s`` > 0 the app also runs the reconciler, and every
successful change through the API (a non-GET under /v1/ answered 2xx) starts a round at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from control_plane.context import OPENAPI, RECONCILER, SERVICES
from control_plane.handlers import credentials, fleet, groups, public, tenants, topics, usage
from control_plane.middleware import error_middleware
from control_plane.openapi import build_document
from control_plane.reconcile_source import ServicesStateSource
from control_plane.reconciler import Reconciler
from control_plane.routes import Route
from control_plane.services import Services, open_services
from control_plane.settings import Settings

ALL_ROUTES: list[Route] = [
    *public.ROUTES,
    *tenants.ROUTES,
    *fleet.ROUTES,
    *topics.ROUTES,
    *groups.ROUTES,
    *credentials.ROUTES,
    *usage.ROUTES,
]


def create_app(settings: Settings, *, services: Services | None = None) -> web.Application:
    # aiohttp's own limit sits above ours, so a body just past the limit gets our clear message.
    app = web.Application(
        middlewares=[kick_reconciler_middleware, error_middleware], client_max_size=settings.json_body_limit_bytes + 1
    )
    for route in ALL_ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    app[OPENAPI] = build_document(ALL_ROUTES)
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
    return app


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
    if request.method != "GET" and 200 <= response.status < 300 and request.path.startswith("/v1/"):
        reconciler = request.app.get(RECONCILER)
        if reconciler is not None:
            reconciler.kick()
    return response
