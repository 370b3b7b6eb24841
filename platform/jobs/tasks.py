"""Jobs of the ledger's upkeep (hourly rollups, replaying a gateway's leftover spool) and of
stored responses (deleting those past their retention)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.inference.responses_store import purge_expired
from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.jobs.rollups import rollup_recent
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool, SpoolLockedError

ROLLUP = "hydrant.ledger.rollup"
REPLAY_SPOOL = "hydrant.ledger.replay_spool"
PURGE_RESPONSES = "hydrant.responses.purge"


async def rollup_ledger(ctx: JobContext, hours: int | str = 3) -> dict[str, Any]:
    return {"rows": await rollup_recent(ctx.database, ctx.clock(), int(hours))}


async def replay_spool(ctx: JobContext) -> dict[str, Any]:
    """Replay the spool in this host's data directory when no gateway holds it.

    A running gateway owns its spool (a file lock) and replays it itself every few
    seconds; this job is for what a gateway left behind when it stopped with the
    database down. A locked spool is skipped, never waited for.
    """
    path = ctx.settings.data_dir / "ledger.spool"
    if not path.exists() or path.stat().st_size == 0:
        return {"replayed": 0}
    try:
        spool = LedgerSpool(path, max_bytes=ctx.settings.spool_max_bytes)
    except SpoolLockedError:
        return {"replayed": 0, "skipped": "held by a running gateway"}
    try:
        ledger = DatabaseLedger(
            ctx.database, spool, DevicePrice(ctx.settings.device_price_per_hour)
        )
        return {"replayed": await ledger.replay_spool()}
    finally:
        spool.close()


async def purge_responses(ctx: JobContext) -> dict[str, Any]:
    """Stored Responses API answers past HYDRANT_RESPONSES_STORE_DAYS: gone, not just unread."""
    return {"deleted": await purge_expired(ctx.database, ctx.clock())}


TASKS = (
    Job(ROLLUP, rollup_ledger),
    Job(REPLAY_SPOOL, replay_spool),
    Job(PURGE_RESPONSES, purge_responses),
)
