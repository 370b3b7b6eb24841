"""Routes: `/admin/models` (deployments) and `/admin/models/{id}/prices` (price versions)."""

from __future__ import annotations

from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody

from hydrant.platform.auth.dependencies import (
    provide_admin_principal,
    require_admin,
)
from hydrant.platform.prices.deps import provide_price_service
from hydrant.platform.prices.schemas import (
    DeploymentCreate,
    DeploymentList,
    DeploymentView,
    PriceCreate,
    PriceList,
    PriceView,
)
from hydrant.platform.prices.service import PriceService


class PriceBookController(Controller):
    path = "/admin/models"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "prices": Provide(provide_price_service),
    }

    @post("/")
    async def create_model(
        self, data: JSONBody[DeploymentCreate], prices: NamedDependency[PriceService]
    ) -> DeploymentView:
        return DeploymentView.of(await prices.create_deployment(data))

    @get("/")
    async def list_models(
        self,
        prices: NamedDependency[PriceService],
        limit: FromQuery[int] = 50,
        after: FromQuery[str | None] = None,
    ) -> DeploymentList:
        rows, more = await prices.list_deployments(limit=limit, after=after)
        return DeploymentList(data=[DeploymentView.of(m) for m in rows], has_more=more)

    @get("/{model_id:str}")
    async def get_model(
        self, model_id: FromPath[str], prices: NamedDependency[PriceService]
    ) -> DeploymentView:
        return DeploymentView.of(await prices.get_deployment(model_id))

    @post("/{model_id:str}/prices")
    async def add_price(
        self,
        model_id: FromPath[str],
        data: JSONBody[PriceCreate],
        prices: NamedDependency[PriceService],
    ) -> PriceView:
        return PriceView.of(await prices.add_price(model_id, data))

    @get("/{model_id:str}/prices")
    async def list_prices(
        self, model_id: FromPath[str], prices: NamedDependency[PriceService]
    ) -> PriceList:
        return PriceList(data=[PriceView.of(p) for p in await prices.prices(model_id)])
