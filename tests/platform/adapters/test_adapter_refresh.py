"""Hot add and remove across gateways: a catalog reloads the registry from the database, and
a reload that read before a local change cannot undo it. Plans allow adapters by name."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from hydrant.engine.protocol import AdapterRef
from hydrant.platform.adapters.catalog import AdapterCatalog, AdapterEntry
from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.db.models import Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.errors import PermissionDenied
from hydrant.platform.inference.serving import check_model_allowed

SERVED = ("demo",)


async def test_a_second_gateway_sees_adds_and_removals_within_its_interval(db: Database) -> None:
    other = AdapterCatalog(db, refresh_s=0.1)  # another gateway's copy: no local change
    other.start()
    try:
        async with db.session() as session:
            session.add(Tenant(id="ten_a", name="a"))
            await session.flush()
            session.add(Adapter(base_model="demo", name="sql", path="/a", tenant_id="ten_a"))

        async def until(present: bool) -> None:
            while (other.resolve("demo:sql", "ten_a", SERVED) is not None) != present:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(until(True), 10)
        async with db.session() as session:
            row = await session.scalar(select(Adapter).where(Adapter.name == "sql"))
            assert row is not None
            await session.delete(row)
        await asyncio.wait_for(until(False), 10)
    finally:
        await other.stop()


async def test_a_reload_that_raced_a_local_change_is_dropped(db: Database) -> None:
    catalog = AdapterCatalog(db)
    entry = AdapterEntry("demo", "new", "/a", None, 0)
    session_factory = db.session

    def racing_session():  # type: ignore[no-untyped-def]
        catalog.put(entry)  # registered here while the reload's query runs
        return session_factory()

    db.session = racing_session  # type: ignore[method-assign]
    try:
        await catalog.refresh()  # read before the row was committed: must not drop it
    finally:
        db.session = session_factory  # type: ignore[method-assign]
    assert catalog.resolve("demo:new", "ten_x", SERVED) == entry
    await catalog.refresh()  # a clean reload reads the database as it is: no such row
    assert catalog.resolve("demo:new", "ten_x", SERVED) is None


def test_a_plan_allows_an_adapter_by_its_base_or_its_own_name() -> None:
    ref = AdapterRef(name="demo:sql", path="/a")

    def principal(*models: str) -> Principal:
        return Principal(
            "ten_a", "key", "p", frozenset({"inference"}), allowed_models=frozenset(models)
        )

    check_model_allowed(principal("demo"), "demo", ref)
    check_model_allowed(principal("demo:sql"), "demo", ref)
    with pytest.raises(PermissionDenied) as refused:
        check_model_allowed(principal("demo:sql"), "demo")  # the base model itself is not
    assert "`demo`" in refused.value.message
    with pytest.raises(PermissionDenied) as refused:
        check_model_allowed(principal("other"), "demo", ref)
    assert "`demo:sql`" in refused.value.message
