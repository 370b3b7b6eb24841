"""`/healthz` (the process answers) and `/readyz` (it can serve)."""

from __future__ import annotations

from litestar import Controller, get
from litestar.datastructures import State
from litestar.response import Response

from hydrant.platform.health.service import check_readiness


class HealthController(Controller):
    include_in_schema = False

    @get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @get("/readyz")
    async def readyz(self, state: State) -> Response[dict[str, object]]:
        readiness = await check_readiness(state.database, state.models, state.runtime)
        return Response(readiness.as_json(), status_code=200 if readiness.ready else 503)
