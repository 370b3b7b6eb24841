"""The gateway's Litestar application, built from settings and the process's backends.

Backends are passed in (not created at import), so tests and the embedded
mode choose them and two apps can live in one process.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from litestar import Litestar, Router
from litestar.types import ControllerRouterHandler
from prometheus_client import CollectorRegistry

from hydrant.platform.auth.brute_force import build_brute_force_guard
from hydrant.platform.auth.dependencies import require_inference
from hydrant.platform.auth.plugin import ControlPlanePlugin
from hydrant.platform.db.session import Database
from hydrant.platform.digests.controllers import DIGEST_CONTROLLERS
from hydrant.platform.engines.controllers import EngineAdminController
from hydrant.platform.gateway import Gateway
from hydrant.platform.health.controllers import HealthController
from hydrant.platform.health.service import ModelRuntime
from hydrant.platform.http.client_address import parse_trusted_proxies
from hydrant.platform.http.errors import EXCEPTION_HANDLERS
from hydrant.platform.http.hardening import cors_config, hardening_middleware
from hydrant.platform.http.openapi import declare_error_responses, openapi_config
from hydrant.platform.http.request_id import add_request_id_header
from hydrant.platform.inference.controllers import InferenceController, ScoringController
from hydrant.platform.inference.responses_seal import ResponseSealer
from hydrant.platform.inference.responses_store import ResponseStore
from hydrant.platform.inference.tokenization import TokenizationController
from hydrant.platform.metrics import GatewayMetrics, bearer_token_guard, metrics_route
from hydrant.platform.reports.controllers import REPORT_CONTROLLERS
from hydrant.settings import ModelSpec, Settings
from hydrant.web import web_routes

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    database: Database | None = None,
    runtime: ModelRuntime | None = None,
    models: Sequence[ModelSpec] | None = None,
    gateway: Gateway | None = None,
    metric_registries: Sequence[CollectorRegistry] = (),
) -> Litestar:
    """The app; with a `gateway` it also serves `/v1` from the gateway's model registry."""
    db = database or Database(settings.effective_database_url)
    served = tuple(models if models is not None else settings.served_models())

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        log.info("gateway starting", extra={"models": [m.name for m in served]})
        if gateway is not None:
            await gateway.start()
        try:
            yield
        finally:
            await brute_force_guard.aclose()
            if gateway is not None:
                await gateway.stop()
            await db.dispose()
            log.info("gateway stopped")

    # `/metrics` renders every registry in this list at each scrape: engines add theirs.
    gateway_metrics = gateway.metrics if gateway is not None else GatewayMetrics()
    # Failed key attempts per source, on the gateway's quota store (Redis: shared by all).
    brute_force_guard = build_brute_force_guard(
        settings, gateway.quota_backend if gateway is not None else None
    )
    registries = [gateway_metrics.registry, brute_force_guard.metrics.registry, *metric_registries]
    handlers: list[ControllerRouterHandler] = [
        HealthController,
        *REPORT_CONTROLLERS,
        *DIGEST_CONTROLLERS,  # /admin/tenants/{id}/digest, /digests/unsubscribe
        metrics_route(
            registries,
            guards=[bearer_token_guard(settings.metrics_token)] if settings.metrics_token else (),
        ),
        *web_routes(),  # `/ui`: the admin and tenant pages (hydrant.web)
    ]
    if gateway is not None:
        handlers.append(
            Router(
                path="/",
                route_handlers=[
                    InferenceController,
                    ScoringController,
                    TokenizationController,
                ],
                guards=[require_inference],  # `principal` is provided app-wide (auth plugin)
            )
        )
        handlers.append(EngineAdminController)  # /admin/engines: limits and KV state
        runtime = runtime or gateway.registry
    app = Litestar(
        route_handlers=handlers,
        lifespan=[lifespan],
        before_send=[add_request_id_header],
        exception_handlers=EXCEPTION_HANDLERS,
        plugins=[ControlPlanePlugin(settings, db)],
        request_max_body_size=settings.max_request_body_bytes,
        middleware=hardening_middleware(settings),  # header size, slow request bodies
        cors_config=cors_config(settings),  # None (closed) unless HYDRANT_CORS_ORIGINS names some
        openapi_config=openapi_config(),  # /schema/openapi.json: routes and shapes, no secrets
        logging_config=None,  # logging is ours (hydrant.logs): redacted, one handler
        debug=False,
    )
    app.state.settings = settings
    app.state.brute_force_guard = brute_force_guard
    declare_error_responses(app)  # every error is an OpenAI error object, in the schema too
    app.state.trusted_proxies = parse_trusted_proxies(settings.trusted_proxies)
    app.state.database = db
    app.state.runtime = runtime
    app.state.models = served
    app.state.gateway_metrics = gateway_metrics
    app.state.metric_registries = registries
    if gateway is not None:
        app.state.registry = gateway.registry
        app.state.inference = gateway.inference
        # The authenticator's secret (resolved once): one read, one warning if it is unset.
        sealer = ResponseSealer(lambda: app.state.authenticator.server_secret)
        app.state.responses = ResponseStore(db, settings.responses_store_days, sealer)
        app.state.abuse = gateway.abuse
        app.state.gateway = gateway
    return app
