"""Queries on API keys, always scoped to the caller (admin keys have no tenant)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.db.models import ApiKey
from hydrant.platform.db.pagination import page_after


async def get_key(session: AsyncSession, principal: Principal, key_id: str) -> ApiKey | None:
    statement = scope_to(select(ApiKey).where(ApiKey.id == key_id), ApiKey, principal)
    return await session.scalar(statement)


async def get_key_for_update(
    session: AsyncSession, principal: Principal, key_id: str
) -> ApiKey | None:
    """The row locked for the rest of the transaction (PostgreSQL), so two rotations
    of one key cannot both succeed; SQLite serializes writers anyway."""
    statement = scope_to(
        select(ApiKey).where(ApiKey.id == key_id).with_for_update(), ApiKey, principal
    )
    return await session.scalar(statement)


async def key_by_prefix(session: AsyncSession, prefix: str) -> ApiKey | None:
    """Unscoped: for adopting the bootstrap key and for prefix-collision checks only."""
    return await session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))


async def successor_of(session: AsyncSession, key_id: str) -> ApiKey | None:
    """Unscoped: asked only about a key the caller has already fetched through its scope."""
    return await session.scalar(select(ApiKey).where(ApiKey.rotated_from_id == key_id))


async def list_keys(
    session: AsyncSession,
    principal: Principal,
    *,
    tenant_id: str | None,
    admin_keys: bool,
    limit: int,
    after: str | None,
) -> tuple[Sequence[ApiKey], bool]:
    statement = scope_to(select(ApiKey), ApiKey, principal)
    if tenant_id is not None:
        statement = statement.where(ApiKey.tenant_id == tenant_id)
    elif admin_keys:
        statement = statement.where(ApiKey.tenant_id.is_(None))
    cursor = scope_to(select(ApiKey.created_at), ApiKey, principal)
    return await page_after(
        session, statement, ApiKey, limit=limit, after=after, cursor_scope=cursor
    )
