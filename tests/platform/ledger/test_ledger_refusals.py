"""An entry the database refuses (a constraint) never takes others down, and is never dropped."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path

from ledger_requests import request_context as _ctx
from sqlalchemy import select

from hydrant.engine.protocol import RequestUsage
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool

OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(prompt_tokens=3, cached_tokens=0, completion_tokens=4, device_ns=1000),
    finished_at=utcnow(),
)


async def _ids(database: Database) -> set[str]:
    async with database.session() as session:
        return set(await session.scalars(select(LedgerEntry.request_id)))


async def test_a_refused_entry_is_set_aside_and_its_batch_lands(
    database_url: str, tmp_path: Path
) -> None:
    database = Database(database_url)
    try:
        async with database.session() as session:
            session.add(Tenant(id="ten_real", name="real"))
        spool = LedgerSpool(tmp_path / "ledger.spool")
        ledger = DatabaseLedger(database, spool, DevicePrice(Decimal("1")))
        await asyncio.gather(
            *(ledger.record(_ctx(f"good{i}", "ten_real"), OUTCOME) for i in range(5)),
            ledger.record(_ctx("bad", "ten_missing"), OUTCOME),  # no such tenant: FK refuses
        )
        assert await _ids(database) == {f"good{i}" for i in range(5)}
        rejected = [json.loads(line) for line in ledger.rejected_path.read_text().splitlines()]
        assert [r["entry"]["request_id"] for r in rejected] == ["bad"]
        assert spool.pending() == 0

        # in the spool, a refused entry does not block the ones behind it
        spool.append(ledger._spool_entry(_ctx("bad2", "ten_missing"), OUTCOME))
        spool.append(ledger._spool_entry(_ctx("after", "ten_real"), OUTCOME))
        assert await ledger.replay_spool() == 2
        assert "after" in await _ids(database)
        assert spool.pending() == 0
        assert "bad2" in ledger.rejected_path.read_text()
        spool.close()
    finally:
        await database.dispose()
