"""Queries on model deployments and their price versions (global data, not tenant data)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.models import ModelDeployment, Price
from hydrant.platform.db.pagination import page_after


async def get_deployment(session: AsyncSession, model_id: str) -> ModelDeployment | None:
    return await session.get(ModelDeployment, model_id)


async def deployment_named(session: AsyncSession, name: str) -> ModelDeployment | None:
    return await session.scalar(select(ModelDeployment).where(ModelDeployment.name == name))


async def list_deployments(
    session: AsyncSession, *, limit: int, after: str | None
) -> tuple[Sequence[ModelDeployment], bool]:
    return await page_after(
        session, select(ModelDeployment), ModelDeployment, limit=limit, after=after
    )


async def prices_of(session: AsyncSession, model_id: str) -> Sequence[Price]:
    statement = select(Price).where(Price.model_id == model_id).order_by(Price.effective_from)
    return (await session.scalars(statement)).all()


async def price_starting_at(session: AsyncSession, model_id: str, moment: datetime) -> Price | None:
    statement = select(Price).where(Price.model_id == model_id, Price.effective_from == moment)
    return await session.scalar(statement)


async def price_in_force(session: AsyncSession, model_id: str, moment: datetime) -> Price | None:
    """The version that applies at `moment`: the latest one effective at or before it."""
    statement = (
        select(Price)
        .where(Price.model_id == model_id, Price.effective_from <= moment)
        .order_by(Price.effective_from.desc())
        .limit(1)
    )
    return await session.scalar(statement)
