"""Queries on adapters (registry data: admin-only, so no tenant scoping here; the
gateway's catalog applies who may see what)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.db.models import ModelDeployment


async def adapter_named(session: AsyncSession, base_model: str, name: str) -> Adapter | None:
    statement = select(Adapter).where(Adapter.base_model == base_model, Adapter.name == name)
    return await session.scalar(statement)


async def adapters_of(session: AsyncSession, base_model: str) -> Sequence[Adapter]:
    statement = select(Adapter).where(Adapter.base_model == base_model).order_by(Adapter.name)
    return (await session.scalars(statement)).all()


async def all_adapters(session: AsyncSession) -> Sequence[Adapter]:
    statement = select(Adapter).order_by(Adapter.base_model, Adapter.name)
    return (await session.scalars(statement)).all()


async def price_models(session: AsyncSession, names: Sequence[str]) -> dict[str, str]:
    """Price-book row id by model name, for `names`."""
    if not names:
        return {}
    statement = select(ModelDeployment.name, ModelDeployment.id).where(
        ModelDeployment.name.in_(names)
    )
    return {name: model_id for name, model_id in (await session.execute(statement)).all()}
