"""`/healthz` (the process answers) and `/readyz` (it can serve); `/health` is `/readyz`
under vLLM's name, what a gateway fronting this server as an upstream pool member probes
(dispatch.upstream_health), as it probes a vLLM."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.response import Response

from hydrant.platform.db.session import Database
from hydrant.platform.health.service import ModelRuntime, check_readiness
from hydrant.settings import ModelSpec


class HealthController(Controller):
    include_in_schema = False

    @get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @get(["/readyz", "/health"])
    async def readyz(
        self,
        database: NamedDependency[Database],
        served_models: NamedDependency[tuple[ModelSpec, ...]],
        runtime: NamedDependency[ModelRuntime | None],
    ) -> Response[dict[str, object]]:
        readiness = await check_readiness(database, served_models, runtime)
        return Response(readiness.as_json(), status_code=200 if readiness.ready else 503)
