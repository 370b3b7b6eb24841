"""Deployment rows and the price book the request path reads without a query.

Every served model needs a `models` row (ledger entries reference it) and,
to be billed, a price version. On start the gateway makes sure both exist
(the configured default price applies only where a model has none yet), then
keeps an in-memory copy of the prices in force, refreshed in the background,
so admission can reserve a request's maximum cost without touching the database.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.billing.pricing import Price as PriceValue
from hydrant.platform.billing.pricing import batch_price
from hydrant.platform.db.models import ModelDeployment, Price
from hydrant.platform.db.refreshed_copy import RefreshedCopy
from hydrant.platform.db.session import Database
from hydrant.settings import ModelSpec

log = logging.getLogger(__name__)

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)


async def ensure_deployments(
    database: Database, specs: Sequence[ModelSpec], default: PriceValue | None
) -> None:
    async with database.session() as session:
        for spec in specs:
            row = await session.scalar(
                select(ModelDeployment).where(ModelDeployment.name == spec.name)
            )
            if row is None:
                row = ModelDeployment(name=spec.name, path=str(spec.path))
                session.add(row)
                await session.flush()
            elif row.path != str(spec.path):
                row.path = str(spec.path)
            has_price = await session.scalar(select(Price.id).where(Price.model_id == row.id))
            if has_price is None and default is not None:
                session.add(
                    Price(
                        model_id=row.id,
                        effective_from=EPOCH,
                        input_per_mtok=default.input_per_million,
                        cached_input_per_mtok=default.cached_rate,
                        output_per_mtok=default.output_per_million,
                    )
                )
                log.info("default price set", extra={"model": spec.name})


async def record_swap(session: AsyncSession, model: str, path: str) -> None:
    """After a hot swap, the model's row names the checkpoint its pool now serves: new LoRA
    adapters are checked against that one at registration (a gateway's start sets it from
    its configuration again)."""
    row = await session.scalar(select(ModelDeployment).where(ModelDeployment.name == model))
    if row is not None:
        row.path = path


class PriceBook(RefreshedCopy):
    """Prices in force now, by model name; `refresh()` reloads them from the database.
    Calling it gives a model's interactive price, `batch()` its Batch API price."""

    copy_name = "price-book"

    def __init__(self, database: Database, refresh_s: float = 30.0) -> None:
        self.database = database
        self.refresh_s = refresh_s
        self._prices: dict[str, PriceValue] = {}
        self._batch_prices: dict[str, PriceValue] = {}

    def __call__(self, model: str) -> PriceValue | None:
        return self._prices.get(model)

    def batch(self, model: str) -> PriceValue | None:
        return self._batch_prices.get(model)

    async def refresh(self) -> None:
        now = datetime.now(UTC)
        async with self.database.session() as session:
            rows = (
                await session.execute(
                    select(ModelDeployment.name, Price)
                    .join(Price, Price.model_id == ModelDeployment.id)
                    .where(Price.effective_from <= now)
                    .order_by(ModelDeployment.name, Price.effective_from)
                )
            ).all()
        prices: dict[str, PriceValue] = {}
        batch_prices: dict[str, PriceValue] = {}
        for name, price in rows:  # ordered by time: the last one per model is in force
            prices[name] = PriceValue(
                input_per_million=Decimal(price.input_per_mtok),
                output_per_million=Decimal(price.output_per_mtok),
                cached_input_per_million=Decimal(price.cached_input_per_mtok),
            )
            batch_prices[name] = batch_price(
                prices[name],
                input_per_million=price.batch_input_per_mtok,
                cached_input_per_million=price.batch_cached_input_per_mtok,
                output_per_million=price.batch_output_per_mtok,
            )
        self._prices, self._batch_prices = prices, batch_prices
