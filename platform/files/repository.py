"""Queries on files, every one scoped to its tenant (`auth.scoping`): a file's content is
its tenant's alone, so even an admin key reads only its own tenant's (none)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.scoping import scope_to_tenant
from hydrant.platform.db.batch_models import StoredFile
from hydrant.platform.db.pagination import page_after


async def live_file(
    session: AsyncSession, tenant_id: str | None, file_id: str, now: datetime
) -> StoredFile | None:
    """The tenant's file `file_id`, unless it has expired (an expired file is never read)."""
    statement = select(StoredFile).where(StoredFile.id == file_id, StoredFile.expires_at >= now)
    return await session.scalar(scope_to_tenant(statement, StoredFile, tenant_id))


async def page_of_files(
    session: AsyncSession,
    tenant_id: str | None,
    now: datetime,
    *,
    purpose: str | None,
    limit: int,
    after: str | None,
    descending: bool,
) -> tuple[Sequence[StoredFile], bool]:
    statement = select(StoredFile).where(StoredFile.expires_at >= now)
    if purpose is not None:
        statement = statement.where(StoredFile.purpose == purpose)
    cursor = scope_to_tenant(select(StoredFile.created_at), StoredFile, tenant_id)
    return await page_after(
        session,
        scope_to_tenant(statement, StoredFile, tenant_id),
        StoredFile,
        limit=limit,
        after=after,
        cursor_scope=cursor,
        descending=descending,
    )


async def expired_files(
    session: AsyncSession, now: datetime, limit: int
) -> Sequence[tuple[str, str, str]]:
    """(id, tenant, storage) of files past their expiry, oldest first (the purge's work)."""
    statement = (
        select(StoredFile.id, StoredFile.tenant_id, StoredFile.storage)
        .where(StoredFile.expires_at < now)
        .order_by(StoredFile.expires_at)
        .limit(limit)
    )
    return [(row[0], row[1], row[2]) for row in (await session.execute(statement)).all()]


async def delete_files(session: AsyncSession, file_ids: Sequence[str]) -> None:
    """Rows and their blobs (the blobs go with them: ON DELETE CASCADE)."""
    await session.execute(delete(StoredFile).where(StoredFile.id.in_(file_ids)))


async def existing_ids(session: AsyncSession, file_ids: Sequence[str]) -> set[str]:
    """Which of `file_ids` have a row (any tenant's, expired or not): the orphan sweep's
    question, asked by a system job, not on a tenant's behalf."""
    statement = select(StoredFile.id).where(StoredFile.id.in_(file_ids))
    return set((await session.scalars(statement)).all())
