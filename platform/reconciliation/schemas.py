"""The reconciliation report as JSON and CSV: money in cents as decimal strings, hours to
six places (a display of exact seconds, which the rows also carry)."""

from __future__ import annotations

import csv
import io
from datetime import date, datetime
from decimal import Decimal

import msgspec

from hydrant.platform.reconciliation.identity import PoolDay, TenantLine, hours
from hydrant.platform.reconciliation.service import DayReconciliation

_HOURS = Decimal("0.000001")
_MICROSECONDS = Decimal("0.000001")  # the timeline's resolution
CSV_COLUMNS = (
    "record",
    "model",
    "tenant_id",
    "held_hours",
    "busy_hours",
    "utilization",
    "held_cost",
    "request_cost",
    "idle_cost",
    "load_cost",
    "drain_cost",
    "asleep_cost",
    "revenue",
    "device_cost",
    "margin",
)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _hours(seconds: Decimal) -> Decimal:
    return hours(seconds).quantize(_HOURS)


class PoolRow(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    held_seconds: Decimal
    held_hours: Decimal
    busy_hours: Decimal
    load_hours: Decimal
    ready_hours: Decimal
    drain_hours: Decimal
    asleep_hours: Decimal
    utilization: Decimal | None
    price_per_hour: Decimal
    held_cost: Decimal
    request_cost: Decimal
    idle_cost: Decimal
    load_cost: Decimal
    drain_cost: Decimal
    asleep_cost: Decimal
    unspread_idle_cost: Decimal
    balances: bool

    @classmethod
    def of(cls, pool: PoolDay) -> PoolRow:
        return cls(
            model=pool.model,
            held_seconds=pool.held_seconds.quantize(_MICROSECONDS),
            held_hours=_hours(pool.held_seconds),
            busy_hours=_hours(pool.busy_seconds),
            load_hours=_hours(pool.seconds["load"]),
            ready_hours=_hours(pool.seconds["ready"]),
            drain_hours=_hours(pool.seconds["drain"]),
            asleep_hours=_hours(pool.seconds["asleep"]),
            utilization=pool.utilization,
            price_per_hour=pool.price_per_hour,
            held_cost=pool.held_cost,
            request_cost=pool.request_cost,
            idle_cost=pool.idle_cost,
            load_cost=pool.load_cost,
            drain_cost=pool.drain_cost,
            asleep_cost=pool.asleep_cost,
            unspread_idle_cost=pool.unspread_idle_cost,
            balances=pool.balances,
        )


class TenantRow(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    tenant_id: str
    busy_hours: Decimal
    revenue: Decimal
    device_cost: Decimal
    idle_cost: Decimal
    margin: Decimal

    @classmethod
    def of(cls, model: str, line: TenantLine) -> TenantRow:
        return cls(
            model=model,
            tenant_id=line.tenant_id,
            busy_hours=_hours(line.busy_seconds),
            revenue=line.revenue,
            device_cost=line.device_cost,
            idle_cost=line.idle_cost,
            margin=line.margin,
        )


class ReconciliationView(msgspec.Struct, frozen=True, kw_only=True):
    object: str
    day: date
    source: str
    computed_at: datetime
    pools: list[PoolRow]
    tenants: list[TenantRow]

    @classmethod
    def of(cls, result: DayReconciliation) -> ReconciliationView:
        return cls(
            object="reconciliation",
            day=result.day,
            source=result.source,
            computed_at=result.computed_at,
            pools=[PoolRow.of(p) for p in result.pools],
            tenants=[TenantRow.of(p.model, line) for p in result.pools for line in p.lines],
        )


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) and not _number(text) else text


def _number(text: str) -> bool:
    try:
        Decimal(text)
    except ArithmeticError:
        return False
    return True


def reconciliation_csv(view: ReconciliationView) -> str:
    """One CSV: a `pool` line per pool, then a `tenant` line per tenant and model; the
    columns a line's kind has no value for are empty."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for pool in view.pools:
        values: dict[str, object] = {"record": "pool", **msgspec.structs.asdict(pool)}
        writer.writerow([_cell(values.get(c)) for c in CSV_COLUMNS])
    for line in view.tenants:
        values = {"record": "tenant", **msgspec.structs.asdict(line)}
        writer.writerow([_cell(values.get(c)) for c in CSV_COLUMNS])
    return buffer.getvalue()


def download_name(day: date) -> str:
    return f"hydrant-reconciliation-{day:%Y%m%d}.csv"
