"""Route: `GET /admin/engines` (admin keys): each model's engine limits, KV state, lengths seen."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.dependencies import require_admin
from hydrant.platform.engines.schemas import EngineList
from hydrant.platform.engines.service import list_engines
from hydrant.platform.inference.deps import InferenceApi


class EngineAdminController(Controller):
    path = "/admin/engines"
    guards = [require_admin]

    @get("/")
    async def engines(
        self, db_session: NamedDependency[AsyncSession], inference: NamedDependency[InferenceApi]
    ) -> EngineList:
        return EngineList(data=await list_engines(db_session, inference.registry))
