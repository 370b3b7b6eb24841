"""The hourly rollups keep the Batch API's part apart: batch lines' requests and charges
beside the totals, exact on SQLite and PostgreSQL, rewritten whole by each run."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from report_factories import BASE, add_models, add_tenants, insert_rows, row
from sqlalchemy import select

from hydrant.platform.db.models import LedgerHourlyRollup
from hydrant.platform.db.session import Database
from hydrant.platform.reports.rollups import rollup_hours


async def test_a_rollup_shows_batch_spend_apart_from_interactive(db: Database) -> None:
    hour = BASE + timedelta(hours=5)
    async with db.session() as session:
        tenants = await add_tenants(session, ["acme"])
        models = await add_models(session, ["alpha"])
        acme = tenants["acme"]
        rows = [
            row(acme, "alpha", hour + timedelta(minutes=1), "0.333333", request_id="i1"),
            row(acme, "alpha", hour + timedelta(minutes=2), "0.000001", request_id="i2"),
            row(
                acme,
                "alpha",
                hour + timedelta(minutes=3),
                "0.166667",
                request_id="b1",
                batch_id="batch_a",
            ),
            row(
                acme,
                "alpha",
                hour + timedelta(minutes=4),
                "0.005000",
                request_id="b2",
                batch_id="batch_b",
            ),
            # the next hour: a row of its own, interactive only
            row(acme, "alpha", hour + timedelta(minutes=61), "1", request_id="i3"),
        ]
        await insert_rows(session, rows, models)

    for _ in range(2):  # a second run rewrites the same rows
        written = await rollup_hours(db, hour, hour + timedelta(hours=2))
        assert written == 2
    async with db.session() as session:
        got = list(
            await session.scalars(select(LedgerHourlyRollup).order_by(LedgerHourlyRollup.hour))
        )
    first, second = got
    assert (first.hour, first.requests, first.charged) == (hour, 4, Decimal("0.505001"))
    assert (first.batch_requests, first.batch_charged) == (2, Decimal("0.171667"))
    assert (second.requests, second.batch_requests, second.batch_charged) == (1, 0, Decimal(0))
