"""The adapter registry's rules: registered per base model, checked before they are served.

Why check at registration (peft_config.py): engines load an adapter on its first request,
so a bad one would otherwise fail a tenant's request instead of the admin's call. Each
adapter gets a price-book row named `base:adapter`, so its price versions use the price
book's own API and history; a removed adapter's row stays (retired), since ledger entries
reference its prices.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.adapters import repository
from hydrant.platform.adapters.catalog import AdapterEntry
from hydrant.platform.adapters.peft_config import inspect_adapter
from hydrant.platform.adapters.schemas import AdapterCreate
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.db.models import ModelDeployment, Tenant
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound, Unprocessable
from hydrant.platform.prices import repository as price_book
from hydrant.platform.prices.decimal_text import parse_decimal
from hydrant.platform.prices.service import PriceService


class AdapterListener(Protocol):
    """What the gateway's `AdapterCatalog` offers the service: this node sees a change at
    once; other gateways within their catalog's refresh interval."""

    def put(self, entry: AdapterEntry) -> None: ...

    def discard(self, base_model: str, name: str) -> None: ...


class AdapterService:
    def __init__(
        self, session: AsyncSession, prices: PriceService, listener: AdapterListener | None
    ) -> None:
        self._session = session
        self._prices = prices
        self._listener = listener

    async def register(self, base_model: str, body: AdapterCreate) -> tuple[Adapter, str]:
        """The new adapter and the id of its price-book row."""
        base = await self._base(base_model)
        if await repository.adapter_named(self._session, base.name, body.name) is not None:
            raise Conflict(
                f"the model `{base.name}` has an adapter named {body.name!r}", param="name"
            )
        if body.tenant_id is not None and await self._session.get(Tenant, body.tenant_id) is None:
            raise NotFound(f"no tenant {body.tenant_id!r}", param="tenant_id")
        fee = None
        if body.hosting_fee_per_day is not None:
            if body.tenant_id is None:
                raise InvalidRequest(
                    "a public adapter has no tenant to charge a hosting fee to",
                    param="hosting_fee_per_day",
                )
            fee = parse_decimal(
                body.hosting_fee_per_day,
                param="hosting_fee_per_day",
                places=STORAGE_PLACES,
                integer_digits=10,
            )
        info = inspect_adapter(Path(body.path), Path(base.path))
        if info.problems:
            raise Unprocessable(
                f"{body.path} cannot be served as an adapter of `{base.name}`: "
                + "; ".join(info.problems),
                param="path",
            )
        row = Adapter(
            base_model=base.name,
            name=body.name,
            path=body.path,
            tenant_id=body.tenant_id,
            hosting_fee_per_day=fee,
        )
        self._session.add(row)
        try:
            await self._session.flush()
        except IntegrityError:  # registered concurrently
            raise Conflict(
                f"the model `{base.name}` has an adapter named {body.name!r}", param="name"
            ) from None
        priced = await self._price_model(f"{base.name}:{body.name}", body.path)
        if body.price is not None:
            await self._prices.add_price(priced.id, body.price)
        if self._listener is not None:
            self._listener.put(AdapterEntry.of(row))
        return row, priced.id

    async def list_of(self, base_model: str) -> list[tuple[Adapter, str]]:
        base = await self._base(base_model)
        rows = await repository.adapters_of(self._session, base.name)
        return await self._with_price_models(rows)

    async def bases_by_model_name(self) -> dict[str, str]:
        """Every registered adapter's price-book name (`base:adapter`) and its base model,
        for the models page to tell adapters from models."""
        rows = await repository.all_adapters(self._session)
        return {f"{r.base_model}:{r.name}": r.base_model for r in rows}

    async def remove(self, base_model: str, name: str) -> None:
        row = await repository.adapter_named(self._session, base_model, name)
        if row is None:
            raise NotFound(f"the model `{base_model}` has no adapter {name!r}", param="name")
        await self._session.delete(row)
        priced = await price_book.deployment_named(self._session, f"{base_model}:{name}")
        if priced is not None:
            priced.status = "retired"
        await self._session.flush()
        if self._listener is not None:
            self._listener.discard(base_model, name)

    async def _base(self, name: str) -> ModelDeployment:
        base = await price_book.deployment_named(self._session, name)
        owner, sep, adapter = name.rpartition(":")
        if sep and await repository.adapter_named(self._session, owner, adapter) is not None:
            base = None  # an adapter's own price-book row: adapters do not stack
        if base is None or base.status != "active":
            raise NotFound(f"no model named {name!r}", param="model")
        return base

    async def _price_model(self, name: str, path: str) -> ModelDeployment:
        """The adapter's price-book row: made on first registration, reactivated on a later
        one (its earlier price versions apply again, as they did before)."""
        row = await price_book.deployment_named(self._session, name)
        if row is None:
            row = ModelDeployment(name=name, path=path)
            self._session.add(row)
        else:
            row.path, row.status = path, "active"
        await self._session.flush()
        return row

    async def _with_price_models(self, rows: Sequence[Adapter]) -> list[tuple[Adapter, str]]:
        ids = await repository.price_models(
            self._session, [f"{r.base_model}:{r.name}" for r in rows]
        )
        return [(r, ids.get(f"{r.base_model}:{r.name}", "")) for r in rows]
