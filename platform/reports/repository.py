"""The one aggregate query behind every report: ledger entries grouped by bucket, tenant, model.

Everything is summed in SQL; Python only turns bucket labels into datetimes.
Buckets are cut by `finished_at` in UTC with each backend's own function
(PostgreSQL `date_trunc` on the UTC wall time, SQLite `strftime` on the UTC
text it stores). Money must add up to the cent, so how it is summed depends on
the backend too: PostgreSQL sums `NUMERIC` exactly; SQLite has no decimal type
(it keeps `NUMERIC` as a binary float, and its `SUM` of floats drifts), so each
stored amount is first turned back into its exact integer count of micro-units
(every stored amount has at most 6 places, so `ROUND(x * 10^6)` recovers it)
and those integers are summed, which SQLite does exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    String,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.models import LedgerEntry, ModelDeployment
from hydrant.platform.ledger.attribution import TAG_KEY
from hydrant.platform.reports.query import ReportQuery

SECONDS_PLACES = 9  # the scale of `device_seconds` (NUMERIC(20, 9))
# `minute` only for the organization usage API's `1m` buckets (organization.py).
Truncation = Literal["day", "hour", "minute"]
_SQLITE_FORMATS: dict[Truncation, str] = {
    "day": "%Y-%m-%d 00:00:00",
    "hour": "%Y-%m-%d %H:00:00",
    "minute": "%Y-%m-%d %H:%M:00",
}


class UnsupportedDatabase(RuntimeError):
    """Reports know how to bucket and sum on PostgreSQL and SQLite only."""


@dataclass(frozen=True)
class AggregateRow:
    """One (bucket, tenant, model) group: exact sums, money as Decimal."""

    bucket: datetime
    tenant_id: str
    model: str
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: Decimal
    device_seconds: Decimal
    device_cost: Decimal
    # Of those, the Batch API's lines (ledger entries with a batch_id, at the batch price).
    batch_requests: int = 0
    batch_charged: Decimal = Decimal(0)
    # The device cost is the gateway's estimate (an upstream pool's model: its servers report
    # no device time; dispatch.upstream_cost apportions their wall time), not a measurement.
    device_cost_estimated: bool = False
    # The key, project, hashed end user or tag value of the group when the report is by
    # one (`ReportQuery.by`); None there means entries without it (a tenant-level key).
    group: str | None = None

    @property
    def margin(self) -> Decimal:
        return self.charged - self.device_cost


def _dialect(session: AsyncSession) -> str:
    return session.bind.dialect.name if session.bind is not None else "sqlite"


def bucket_of(dialect: str, unit: Truncation) -> ColumnElement[Any]:
    """The start of the UTC day or hour of `finished_at`, as each backend computes it.

    The constants are inlined (not bound) so the SELECT and GROUP BY expressions
    are the same SQL text, which PostgreSQL requires; they come from a closed set.
    """
    column = LedgerEntry.finished_at
    if dialect == "postgresql":
        utc_wall_time = func.timezone(literal_column("'UTC'"), column)
        return func.date_trunc(literal_column(f"'{unit}'"), utc_wall_time)
    if dialect == "sqlite":
        return func.strftime(literal_column(f"'{_SQLITE_FORMATS[unit]}'"), column)
    raise UnsupportedDatabase(f"reports do not support the {dialect!r} database")


def exact_sum(dialect: str, column: Any, places: int) -> ColumnElement[Any]:
    """SUM of a fixed-point column without float drift (see the module docstring)."""
    if dialect == "postgresql":
        return func.coalesce(func.sum(column), 0)
    scaled = cast(func.round(column * (10**places)), BigInteger)
    return func.coalesce(func.sum(scaled), 0)


def exact_value(value: Any, dialect: str, places: int) -> Decimal:
    """The Decimal of an `exact_sum` result (micro-units on SQLite, NUMERIC on PostgreSQL)."""
    return _decimal(value, dialect, places)


def bucket_value(value: Any) -> datetime:
    """The aware UTC datetime of a `bucket_of` result."""
    return _bucket_value(value)


def _decimal(value: Any, dialect: str, places: int) -> Decimal:
    if dialect == "postgresql":
        return value if isinstance(value, Decimal) else Decimal(int(value))
    return Decimal(int(value)).scaleb(-places)


def _bucket_value(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def reported_model() -> ColumnElement[str]:
    """The model a report line names: the base model, or `base:adapter` for a LoRA
    adapter's requests (each adapter its own line, as its own price-book entry)."""
    return case(
        (LedgerEntry.adapter.is_(None), ModelDeployment.name),
        else_=ModelDeployment.name + ":" + LedgerEntry.adapter,
    )


def tag_value(dialect: str, key: str) -> ColumnElement[Any]:
    """One tag's value of an entry (NULL without it), as each backend reads JSON.

    The key is a bound parameter rendered inline at execution (`literal_execute`, escaped by
    the driver's dialect), so SELECT and GROUP BY are the same SQL text on PostgreSQL, as
    `bucket_of` needs too; no SQL is built from the key's string here.
    """
    if TAG_KEY.fullmatch(key) is None:
        raise ValueError(f"not a tag key: {key!r}")
    if dialect == "postgresql":
        name = bindparam(None, key, type_=String, literal_execute=True)
        return func.json_extract_path_text(LedgerEntry.tags, name)
    if dialect == "sqlite":
        path = bindparam(None, f'$."{key}"', type_=String, literal_execute=True)
        return func.json_extract(LedgerEntry.tags, path)
    raise UnsupportedDatabase(f"reports do not support the {dialect!r} database")


def attribute_of(dialect: str, query: ReportQuery) -> ColumnElement[Any] | None:
    """The column a report `by` an attribution groups on (None: not by one)."""
    if query.by is None:
        return None
    tag = query.tag
    if tag is not None:
        return tag_value(dialect, tag)
    columns = {
        "key": LedgerEntry.api_key_id,
        "project": LedgerEntry.project_id,
        "user": LedgerEntry.end_user,
    }
    return columns[query.by].expression


def aggregate_statement(dialect: str, principal: Principal, query: ReportQuery) -> Select[Any]:
    bucket = bucket_of(dialect, query.group_by).label("bucket")
    model = reported_model()
    attribute = attribute_of(dialect, query)
    extra = [] if attribute is None else [attribute]
    statement = (
        select(
            bucket,
            LedgerEntry.tenant_id,
            model,
            func.count().label("requests"),
            func.coalesce(func.sum(LedgerEntry.input_tokens), 0),
            func.coalesce(func.sum(LedgerEntry.cached_tokens), 0),
            func.coalesce(func.sum(LedgerEntry.output_tokens), 0),
            exact_sum(dialect, LedgerEntry.charged, STORAGE_PLACES),
            exact_sum(dialect, LedgerEntry.device_seconds, SECONDS_PLACES),
            exact_sum(dialect, LedgerEntry.device_cost, STORAGE_PLACES),
            func.count(LedgerEntry.batch_id),  # COUNT(column): the rows with a batch
            exact_sum(
                dialect,
                case((LedgerEntry.batch_id.is_not(None), LedgerEntry.charged), else_=0),
                STORAGE_PLACES,
            ),
            *extra,
        )
        .join(ModelDeployment, ModelDeployment.id == LedgerEntry.model_id)
        .where(LedgerEntry.finished_at >= query.since, LedgerEntry.finished_at < query.until)
    )
    if query.tenant_id is not None:
        statement = statement.where(LedgerEntry.tenant_id == query.tenant_id)
    if query.model is not None:
        statement = statement.where(model == query.model)
    statement = scope_to(statement, LedgerEntry, principal)
    group = (bucket_of(dialect, query.group_by), LedgerEntry.tenant_id, model, *extra)
    return statement.group_by(*group).order_by(*group)


async def aggregate(
    session: AsyncSession, principal: Principal, query: ReportQuery
) -> Sequence[AggregateRow]:
    """The report's rows, in bucket, tenant, model order, seen through `principal`'s scope."""
    dialect = _dialect(session)
    result = await session.execute(aggregate_statement(dialect, principal, query))
    return [
        AggregateRow(
            bucket=_bucket_value(row[0]),
            tenant_id=row[1],
            model=row[2],
            requests=int(row[3]),
            input_tokens=int(row[4]),
            cached_tokens=int(row[5]),
            output_tokens=int(row[6]),
            charged=_decimal(row[7], dialect, STORAGE_PLACES),
            device_seconds=_decimal(row[8], dialect, SECONDS_PLACES),
            device_cost=_decimal(row[9], dialect, STORAGE_PLACES),
            batch_requests=int(row[10]),
            batch_charged=_decimal(row[11], dialect, STORAGE_PLACES),
            group=None if query.by is None or row[12] is None else str(row[12]),
        )
        for row in result.all()
    ]
