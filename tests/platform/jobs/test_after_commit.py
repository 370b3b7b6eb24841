"""Jobs queued in a transaction are sent after its commit, and never after a rollback."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from hydrant.platform.db.models import Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.jobs.after_commit import enqueue_after_commit


async def test_sent_only_after_the_commit(db: Database) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    def enqueue(name: str, kwargs: dict[str, Any]) -> None:
        sent.append((name, kwargs))

    async with db.session() as session:
        session.add(Tenant(id="ten_a", name="a"))
        await session.flush()
        enqueue_after_commit(session, enqueue, "job.one", tenant_id="ten_a")
        enqueue_after_commit(session, enqueue, "job.two")
        assert sent == []  # still inside the transaction
    assert sent == [("job.one", {"tenant_id": "ten_a"}), ("job.two", {})]

    async with db.session() as session:  # the next commit of another session sends nothing
        session.add(Tenant(id="ten_b", name="b"))
    assert len(sent) == 2


async def test_dropped_on_rollback_and_kept_across_a_failed_savepoint(db: Database) -> None:
    sent: list[str] = []

    def enqueue(name: str, kwargs: dict[str, Any]) -> None:
        sent.append(name)

    with pytest.raises(RuntimeError):
        async with db.session() as session:
            session.add(Tenant(id="ten_a", name="a"))
            enqueue_after_commit(session, enqueue, "job.rolled_back")
            raise RuntimeError("the request failed")
    assert sent == []

    async with db.session() as session:
        session.add(Tenant(id="ten_a", name="a"))
        await session.flush()
        enqueue_after_commit(session, enqueue, "job.kept")
        with pytest.raises(IntegrityError):
            async with session.begin_nested():  # a duplicate, refused inside a savepoint
                session.add(Tenant(id="ten_a2", name="a"))
    assert sent == ["job.kept"]
