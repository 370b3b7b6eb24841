"""Ledger queries: insert-if-absent keyed by request id, and the price lookups entries need.

Insert-if-absent (`ON CONFLICT DO NOTHING`) is what makes every write path
idempotent: the live write, a retry, a spool replay and a second replay of the
same spool all leave exactly one row per request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import Insert, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.billing.pricing import Price as PriceValue
from hydrant.platform.billing.pricing import batch_price
from hydrant.platform.db.models import LedgerEntry, ModelDeployment, Price

_LEDGER = cast(Table, LedgerEntry.__table__)  # the mapped class's Core table
_INSERTS: dict[str, Insert] = {}


def _insert_statement(dialect: str) -> Insert:
    """The insert-if-absent statement for `dialect`, built once and reused.

    Why: building `insert(...).values(rows)` per flush coerces every value into a
    literal bind and compiles a new statement each time, which was most of the
    gateway's per-request CPU; one statement executed with bound parameters
    compiles once and hits SQLAlchemy's compiled cache (a batch is still sent as
    one multi-row INSERT: "insertmanyvalues", which RETURNING enables).
    """
    statement = _INSERTS.get(dialect)
    if statement is None:
        module = postgresql if dialect == "postgresql" else sqlite
        statement = (
            module.insert(_LEDGER)
            .on_conflict_do_nothing(index_elements=["request_id"])
            .returning(_LEDGER.c.request_id)  # the rows inserted, exact for any batch size
        )
        _INSERTS[dialect] = statement
    return statement


async def insert_if_absent(session: AsyncSession, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert entries whose request id is new; returns how many rows were inserted."""
    values = [dict(row) for row in rows]
    if not values:
        return 0
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    # A Core statement on the session's connection (same transaction): the ORM's
    # execute path (bulk-insert planning, events) costs more than the insert itself.
    connection = await session.connection()
    result = await connection.execute(_insert_statement(dialect), values)
    return len(result.all())


# The PostgreSQL live path (see pinned.py): the same insert-if-absent as one statement whose
# rows arrive as one array per column. Why arrays: a batch of any size is one prepared
# statement (asyncpg caches it on the connection) and one round trip; autocommitted, it
# is its own transaction, so PostgreSQL's reply comes after the commit is durable.
PG_COLUMNS = (
    "request_id",
    "tenant_id",
    "api_key_id",
    "model_id",
    "price_id",
    "status",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "charged",
    "device_seconds",
    "device_cost",
    "started_at",
    "finished_at",
    "batch_id",
    "adapter",
    "project_id",
    "end_user",
    "tags",
    "recorded_at",
)
PG_INSERT = """
INSERT INTO ledger_entries (
    request_id, tenant_id, api_key_id, model_id, price_id, status,
    input_tokens, cached_tokens, output_tokens, charged, device_seconds, device_cost,
    started_at, finished_at, batch_id, adapter, project_id, end_user, tags, recorded_at
)
SELECT
    request_id, tenant_id, api_key_id, model_id, price_id, status,
    input_tokens, cached_tokens, output_tokens, charged, device_seconds, device_cost,
    started_at, finished_at, batch_id, adapter, project_id, end_user, tags::json, recorded_at
FROM unnest(
    $1::varchar[], $2::varchar[], $3::varchar[], $4::varchar[], $5::varchar[], $6::varchar[],
    $7::int4[], $8::int4[], $9::int4[], $10::numeric[], $11::numeric[], $12::numeric[],
    $13::timestamptz[], $14::timestamptz[], $15::varchar[], $16::varchar[],
    $17::varchar[], $18::varchar[], $19::text[], $20::timestamptz[]
) AS entry (
    request_id, tenant_id, api_key_id, model_id, price_id, status,
    input_tokens, cached_tokens, output_tokens, charged, device_seconds, device_cost,
    started_at, finished_at, batch_id, adapter, project_id, end_user, tags, recorded_at
)
ON CONFLICT (request_id) DO NOTHING
RETURNING request_id
"""


async def insert_if_absent_pg(
    driver: Any, rows: Sequence[Mapping[str, Any]], recorded_at: datetime
) -> int:
    """`insert_if_absent` on a raw asyncpg connection outside any transaction (autocommit)."""
    if not rows:
        return 0
    columns = [[row.get(name) for row in rows] for name in PG_COLUMNS[:-2]]
    # The JSON column travels as text (asyncpg has no codec for `json[]`); SQL NULL stays NULL.
    columns.append([_json_text(row.get("tags")) for row in rows])
    columns.append([recorded_at] * len(rows))
    return len(await driver.fetch(PG_INSERT, *columns))


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


async def model_id_for(session: AsyncSession, name: str) -> str | None:
    return await session.scalar(select(ModelDeployment.id).where(ModelDeployment.name == name))


async def ensure_model(session: AsyncSession, name: str, path: str = "") -> str:
    """The deployment row of `name`, created when missing: an entry never waits on admin work."""
    model_id = await model_id_for(session, name)
    if model_id is not None:
        return model_id
    deployment = ModelDeployment(name=name, path=path)
    session.add(deployment)
    await session.flush()
    return deployment.id


async def price_at(session: AsyncSession, model_id: str, moment: datetime) -> Price | None:
    """The price version in force at `moment` (the latest one effective at or before it)."""
    statement = (
        select(Price)
        .where(Price.model_id == model_id, Price.effective_from <= moment)
        .order_by(Price.effective_from.desc())
        .limit(1)
    )
    return await session.scalar(statement)


@dataclass(frozen=True)
class PriceVersion:
    id: str
    effective_from: datetime
    input_per_mtok: Decimal
    cached_input_per_mtok: Decimal
    output_per_mtok: Decimal
    # A Batch API line's prices; None: half the interactive one (`billing.batch_price`).
    batch_input_per_mtok: Decimal | None = None
    batch_cached_input_per_mtok: Decimal | None = None
    batch_output_per_mtok: Decimal | None = None

    def price(self, *, batch: bool = False) -> PriceValue:
        """What a request is charged at under this version: interactive, or a batch line."""
        interactive = PriceValue(
            input_per_million=self.input_per_mtok,
            output_per_million=self.output_per_mtok,
            cached_input_per_million=self.cached_input_per_mtok,
        )
        if not batch:
            return interactive
        return batch_price(
            interactive,
            input_per_million=self.batch_input_per_mtok,
            cached_input_per_million=self.batch_cached_input_per_mtok,
            output_per_million=self.batch_output_per_mtok,
        )

    @classmethod
    def of(cls, row: Price) -> PriceVersion:
        return cls(
            row.id,
            row.effective_from,
            row.input_per_mtok,
            row.cached_input_per_mtok,
            row.output_per_mtok,
            row.batch_input_per_mtok,
            row.batch_cached_input_per_mtok,
            row.batch_output_per_mtok,
        )


async def price_versions(session: AsyncSession, model_id: str) -> list[PriceVersion]:
    """All price versions of a model, oldest first."""
    rows = await session.scalars(
        select(Price).where(Price.model_id == model_id).order_by(Price.effective_from)
    )
    return [PriceVersion.of(p) for p in rows]


async def count_entries(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.count()).select_from(LedgerEntry)) or 0)
