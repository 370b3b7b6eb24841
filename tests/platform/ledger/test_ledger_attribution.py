"""Attribution (project, hashed end user, tags) reaches the ledger row on every write path:
the live write (PostgreSQL's pinned unnest insert, SQLite's insert), the spool and its
replay, and the journal, on each database. An entry without attribution stays NULL."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path

import pytest
from ledger_requests import request_context
from sqlalchemy import select

from hydrant.engine.protocol import RequestUsage
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.attribution import Attribution
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.ledger.spool_codec import decode_record, encode_record

OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(prompt_tokens=3, cached_tokens=0, completion_tokens=4, device_ns=1000),
    finished_at=utcnow(),
)
WHO = Attribution(project_id="proj_web", end_user="ab" * 32, tags={"team": "search", "env": "prod"})


def _ctx(request_id: str, who: Attribution | None = WHO):  # type: ignore[no-untyped-def]
    return dataclasses.replace(request_context(request_id, "ten_a"), attribution=who)


async def _rows(database: Database) -> dict[str, tuple[object, object, object]]:
    async with database.session() as session:
        rows = await session.execute(
            select(
                LedgerEntry.request_id,
                LedgerEntry.project_id,
                LedgerEntry.end_user,
                LedgerEntry.tags,
            )
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}


@pytest.mark.parametrize("commit", ["database", "journal"])
async def test_every_write_path_keeps_the_attribution(
    database_url: str, tmp_path: Path, commit: str
) -> None:
    database = Database(database_url)
    try:
        async with database.session() as session:
            session.add(Tenant(id="ten_a", name="a"))
        spool = LedgerSpool(tmp_path / "ledger.spool")
        ledger = DatabaseLedger(
            database,
            spool,
            DevicePrice(Decimal("1")),
            commit=commit,  # type: ignore[arg-type]
        )
        await ledger.record(_ctx("live"), OUTCOME)
        await ledger.record(_ctx("bare", None), OUTCOME)
        # What the spool keeps while the database is down, replayed later.
        spool.append(ledger._spool_entry(_ctx("spooled"), OUTCOME))
        await ledger.replay_spool()  # in journal mode: the whole journal, "live" too
        expected = ("proj_web", "ab" * 32, {"team": "search", "env": "prod"})
        rows = await _rows(database)
        assert rows["live"] == expected
        assert rows["spooled"] == expected
        assert rows["bare"] == (None, None, None)
        spool.close()
    finally:
        await database.dispose()


def test_the_spool_codec_round_trips_the_attribution() -> None:
    ledger_entry = {"request_id": "r1", "project_id": "proj_web", "tags": {"k": "v"}}
    assert decode_record(encode_record(ledger_entry)) == ledger_entry
