"""Ledger rows across hour boundaries for the export tests, and what they sum to per hour."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

from report_factories import BASE, Row, add_models, add_tenants, awkward_amount, insert_rows
from sqlalchemy import select

from hydrant.platform.db.models import UsageExportRecord
from hydrant.platform.db.session import Database

Key = tuple[str, str, datetime]
Sums = dict[Key, tuple[int, int, int, int, Decimal]]


def rows_across_hours(
    tenants: Sequence[str], models: Sequence[str], count: int, hours: int, *, seed: int
) -> list[Row]:
    """Entries in `hours` hours from BASE, a third of them within a second of an hour's edge."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        hour = BASE + timedelta(hours=rng.randrange(hours))
        if rng.random() < 0.33:  # on either side of the boundary that starts `hour`
            offset = timedelta(microseconds=rng.choice([-1, 0, 1, 999_999, -999_999]))
            finished = hour + offset if hour + offset >= BASE else hour
        else:
            finished = hour + timedelta(seconds=rng.randrange(3600))
        inputs = rng.randrange(0, 5000)
        rows.append(
            Row(
                request_id=f"req_{seed}_{n:05d}",
                tenant_id=rng.choice(tenants),
                model=rng.choice(models),
                finished_at=finished,
                input_tokens=inputs,
                cached_tokens=rng.randrange(0, inputs + 1),
                output_tokens=rng.randrange(0, 3000),
                charged=awkward_amount(rng),
                device_seconds=Decimal(0),
                device_cost=Decimal(0),
            )
        )
    return rows


def relabel(rows: Iterable[Row], prefix: str) -> list[Row]:
    return [replace(r, request_id=f"{prefix}{r.request_id}") for r in rows]


ZERO = (0, 0, 0, 0, Decimal(0))


def _add(
    a: tuple[int, int, int, int, Decimal], b: tuple[int, int, int, int, Decimal]
) -> tuple[int, int, int, int, Decimal]:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def ledger_sums(rows: Iterable[Row], until: datetime) -> Sums:
    """What each (tenant, model, hour) before `until` adds up to, computed in Python."""
    sums: Sums = {}
    for r in rows:
        hour = r.finished_at.replace(minute=0, second=0, microsecond=0)
        if hour < until:
            key = (r.tenant_id, r.model, hour)
            one = (1, r.input_tokens, r.cached_tokens, r.output_tokens, r.charged)
            sums[key] = _add(sums.get(key, ZERO), one)
    return sums


async def records(database: Database) -> list[UsageExportRecord]:
    async with database.session() as session:
        return list(
            await session.scalars(
                select(UsageExportRecord).order_by(
                    UsageExportRecord.hour, UsageExportRecord.sequence, UsageExportRecord.id
                )
            )
        )


def record_sums(rows: Iterable[UsageExportRecord]) -> Sums:
    """The records of each (tenant, model, hour), every sequence added together."""
    sums: Sums = {}
    for r in rows:
        key = (r.tenant_id, r.model, r.hour)
        one = (r.requests, r.input_tokens, r.cached_tokens, r.output_tokens, r.charged)
        sums[key] = _add(sums.get(key, ZERO), one)
    return sums


async def seed_ledger(
    database: Database, *, count: int, hours: int, seed: int, tenants: Sequence[str] = ("acme",)
) -> tuple[dict[str, str], list[Row]]:
    """Tenants (name -> id), one model, and `count` entries over `hours` hours from BASE."""
    async with database.session() as session:
        ids = await add_tenants(session, tenants)
        models = await add_models(session, ["alpha"])
    rows = rows_across_hours(list(ids.values()), list(models), count, hours, seed=seed)
    async with database.session() as session:
        await insert_rows(session, rows, models)
    return ids, rows
