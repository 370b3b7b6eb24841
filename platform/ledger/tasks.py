"""Thin job wrapper of the ledger's upkeep: replaying a spool a stopped gateway left behind."""

from __future__ import annotations

from typing import Any

from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool, SpoolLockedError

REPLAY_SPOOL = "hydrant.ledger.replay_spool"


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


TASKS = (Job(REPLAY_SPOOL, replay_spool),)
