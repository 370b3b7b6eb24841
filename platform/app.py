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

from hydrant.platform.auth.dependencies import require_inference
from hydrant.platform.auth.plugin import ControlPlanePlugin
from hydrant.platform.db.session import Database
from hydrant.platform.gateway import Gateway
from hydrant.platform.health.controllers import HealthController
from hydrant.platform.health.service import ModelRuntime
from hydrant.platform.http.errors import EXCEPTION_HANDLERS
from hydrant.platform.http.request_id import add_request_id_header
from hydrant.platform.inference.controllers import InferenceController
from hydrant.platform.metrics import GatewayMetrics, metrics_route
from hydrant.platform.reports.controllers import REPORT_CONTROLLERS
from hydrant.settings import ModelSpec, Settings

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
            if gateway is not None:
                await gateway.stop()
            await db.dispose()
            log.info("gateway stopped")

    # `/metrics` renders every registry in this list at each scrape: engines add theirs.
    gateway_metrics = gateway.metrics if gateway is not None else GatewayMetrics()
    registries = [gateway_metrics.registry, *metric_registries]
    handlers: list[ControllerRouterHandler] = [
        HealthController,
        *REPORT_CONTROLLERS,
        metrics_route(registries),
    ]
    if gateway is not None:
        handlers.append(
            Router(
                path="/",
                route_handlers=[InferenceController],
                guards=[require_inference],  # `principal` is provided app-wide (auth plugin)
            )
        )
        runtime = runtime or gateway.registry
    app = Litestar(
        route_handlers=handlers,
        lifespan=[lifespan],
        before_send=[add_request_id_header],
        exception_handlers=EXCEPTION_HANDLERS,
        plugins=[ControlPlanePlugin(settings, db)],
        request_max_body_size=settings.max_request_body_bytes,
        logging_config=None,  # logging is ours (hydrant.logs): redacted, one handler
        debug=False,
    )
    app.state.settings = settings
    app.state.database = db
    app.state.runtime = runtime
    app.state.models = served
    app.state.gateway_metrics = gateway_metrics
    app.state.metric_registries = registries
    if gateway is not None:
        app.state.registry = gateway.registry
        app.state.inference = gateway.inference
        app.state.abuse = gateway.abuse
        app.state.gateway = gateway
    return app
