"""The gateway's Litestar application, built from settings and the process's backends.

Backends are passed in (not created at import), so tests and the embedded
mode choose them and two apps can live in one process.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from litestar import Litestar

from hydrant.platform.db.session import Database
from hydrant.platform.health.controllers import HealthController
from hydrant.platform.health.service import ModelRuntime
from hydrant.settings import ModelSpec, Settings

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    database: Database | None = None,
    runtime: ModelRuntime | None = None,
    models: Sequence[ModelSpec] | None = None,
) -> Litestar:
    db = database or Database(settings.effective_database_url)
    served = tuple(models if models is not None else settings.served_models())

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        log.info("gateway starting", extra={"models": [m.name for m in served]})
        try:
            yield
        finally:
            await db.dispose()
            log.info("gateway stopped")

    app = Litestar(
        route_handlers=[HealthController],
        lifespan=[lifespan],
        debug=False,
    )
    app.state.settings = settings
    app.state.database = db
    app.state.runtime = runtime
    app.state.models = served
    return app
