"""Keyset pagination over (created_at, id), the order every admin list uses.

Why keyset and not offsets: a page stays correct while rows are being added
(an offset would skip or repeat rows), and the cost does not grow with depth.
The cursor is the id of the last row seen (`after`, as in OpenAI's lists); it
is looked up through the caller's scope, so another tenant's id is an unknown
cursor like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.errors import InvalidRequest

T = TypeVar("T")

MAX_PAGE = 200


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    return limit


async def page_after(
    session: AsyncSession,
    statement: Select[T],
    model: Any,
    *,
    limit: int,
    after: str | None,
    cursor_scope: Select[Any] | None = None,
    descending: bool = False,
) -> tuple[Sequence[T], bool]:
    """One page of `statement` (already scoped) and whether more rows follow it.

    `cursor_scope` is a scoped `select(model.created_at)` used to find the cursor
    row; it defaults to an unscoped lookup, for data that is not tenant data.
    `descending`: newest first (OpenAI's files and batches lists), `after` then
    names the last (oldest) row of the page before.
    """
    check_limit(limit)
    if after is not None:
        lookup = cursor_scope if cursor_scope is not None else select(model.created_at)
        moment = await session.scalar(lookup.where(model.id == after))
        if moment is None:
            raise InvalidRequest("unknown cursor: `after` must be an id from a page", param="after")
        if descending:
            later = or_(
                model.created_at < moment, and_(model.created_at == moment, model.id < after)
            )
        else:
            later = or_(
                model.created_at > moment, and_(model.created_at == moment, model.id > after)
            )
        statement = statement.where(later)
    order = (
        (model.created_at.desc(), model.id.desc()) if descending else (model.created_at, model.id)
    )
    ordered = statement.order_by(*order).limit(limit + 1)
    rows = (await session.scalars(ordered)).all()
    return rows[:limit], len(rows) > limit
