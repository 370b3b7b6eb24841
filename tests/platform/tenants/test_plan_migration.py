"""Migration 0002 on a database that already holds tenants, keys and ledger entries.

The trap it guards: on SQLite a batch rebuild of `tenants` drops the table,
and with foreign keys on that cascades to `api_keys`. Up and down must keep
every row.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from hydrant.platform.db import migrate
from hydrant.platform.db.session import Database

ROWS = [
    "INSERT INTO tenants (id, name, status, timezone, created_at, updated_at)"
    " VALUES ('ten_1', 'acme', 'active', 'UTC', '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
    "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, scopes, created_at)"
    " VALUES ('key_1', 'ten_1', '', 'hyd_live_abcdefgh', 'h', 'inference', '2026-01-01 00:00:00')",
    "INSERT INTO models (id, name, path, status, created_at)"
    " VALUES ('mdl_1', 'demo', '/m', 'active', '2026-01-01 00:00:00')",
    "INSERT INTO ledger_entries (request_id, tenant_id, api_key_id, model_id, status,"
    " input_tokens, cached_tokens, output_tokens, charged, device_seconds, device_cost,"
    " started_at, finished_at, recorded_at) VALUES ('req_1', 'ten_1', 'key_1', 'mdl_1',"
    " 'finished', 1, 0, 1, 0.5, 0, 0, '2026-01-01 00:00:00', '2026-01-01 00:00:01',"
    " '2026-01-01 00:00:01')",
]


def _run(url: str, *statements: str) -> list[tuple]:
    async def go() -> list[tuple]:
        database = Database(url)
        try:
            async with database.session() as session:
                result = None
                for statement in statements:
                    result = await session.execute(text(statement))
                return (
                    [tuple(r) for r in result] if result is not None and result.returns_rows else []
                )
        finally:
            await database.dispose()

    return asyncio.run(go())


def _survivors(url: str) -> tuple:
    return (
        _run(url, "SELECT id FROM tenants"),
        _run(url, "SELECT id, tenant_id FROM api_keys"),
        _run(url, "SELECT request_id, api_key_id FROM ledger_entries"),
    )


def test_upgrade_and_downgrade_keep_every_row(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0001")
    _run(url, *ROWS)
    before = _survivors(url)
    assert before == ([("ten_1",)], [("key_1", "ten_1")], [("req_1", "key_1")])

    migrate.upgrade(url)
    assert _survivors(url) == before
    assert _run(url, "SELECT plan_id FROM tenants") == [("pln_default",)]
    assert _run(url, "SELECT name, max_prompt_tokens FROM plans") == [("default", 8192)]

    migrate.downgrade(url, "0001")
    assert _survivors(url) == before
    migrate.upgrade(url)
    assert _survivors(url) == before
    migrate.check(url)
