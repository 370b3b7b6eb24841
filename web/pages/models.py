"""Models and prices: the deployments, the price in force and its history, adding either."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.adapters.deps import provide_adapter_service
from hydrant.platform.adapters.service import AdapterService
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import DomainError
from hydrant.platform.prices.controllers import provide_price_service
from hydrant.platform.prices.schemas import DeploymentCreate, PriceCreate
from hydrant.platform.prices.service import PriceService
from hydrant.web.context import Page
from hydrant.web.forms import convert, read_form

NOTICES = {"model": "Model added.", "price": "Price added."}


class ModelPagesController(Controller):
    path = "/models"
    dependencies = {
        "prices": Provide(provide_price_service),
        "adapters": Provide(provide_adapter_service),
    }

    @get("/")
    async def list_page(
        self,
        page: NamedDependency[Page],
        prices: NamedDependency[PriceService],
        adapters: NamedDependency[AdapterService],
        notice: FromQuery[str | None] = None,
    ) -> Response[str]:
        page.admin()
        return await _render(page, prices, adapters, notice=notice)

    @post("/")
    async def create(
        self,
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        db_session: NamedDependency[AsyncSession],
        prices: NamedDependency[PriceService],
        adapters: NamedDependency[AdapterService],
    ) -> Response[str]:
        form = await read_form(request, page)
        page.admin()
        try:
            body = convert(
                DeploymentCreate,
                {
                    "name": form.text("name"),
                    "path": form.text("path"),
                    "quantization": form.optional("quantization"),
                },
            )
            await prices.create_deployment(body)
        except DomainError as exc:
            await db_session.rollback()
            return await _render(
                page, prices, adapters, error=exc.message, status=exc.status, values=form.fields
            )
        return page.redirect("/ui/models?notice=model")

    @post("/{model_id:str}/prices")
    async def add_price(
        self,
        model_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        db_session: NamedDependency[AsyncSession],
        prices: NamedDependency[PriceService],
        adapters: NamedDependency[AdapterService],
    ) -> Response[str]:
        form = await read_form(request, page)
        page.admin()
        try:
            body = convert(
                PriceCreate,
                {
                    "input_per_mtok": form.text("input_per_mtok"),
                    "output_per_mtok": form.text("output_per_mtok"),
                    "cached_input_per_mtok": form.optional("cached_input_per_mtok"),
                },
            )
            await prices.add_price(model_id, body)
        except DomainError as exc:
            if exc.status == 404:
                raise
            await db_session.rollback()
            return await _render(
                page, prices, adapters, error=exc.message, status=exc.status, values=form.fields
            )
        return page.redirect("/ui/models?notice=price")


async def _render(
    page: Page,
    prices: PriceService,
    adapters: AdapterService,
    *,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
    values: dict[str, str] | None = None,
) -> Response[str]:
    models, more = await prices.list_deployments(limit=200)
    bases = await adapters.bases_by_model_name()  # LoRA adapters have price-book rows too
    now = utcnow()
    rows = []
    for model in models:
        history = list(await prices.prices(model.id))
        current = await prices.price_in_force(model.id, now)
        base = bases.get(model.name)
        rows.append({"model": model, "current": current, "history": history, "base": base})
    return page.render(
        "models.html",
        status=status,
        rows=rows,
        has_more=more,
        notice=NOTICES.get(notice or ""),
        error=error,
        values=values or {},
    )
