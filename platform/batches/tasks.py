"""Thin job wrappers of the Batch API (Celery or the embedded loop): run a batch, and the
sweep that starts every batch no runner holds (never started, or its runner died)."""

from __future__ import annotations

import logging
from typing import Any

from hydrant.platform.batches import repository
from hydrant.platform.batches.book import RUN_JOB
from hydrant.platform.batches.deps import batch_runner
from hydrant.platform.jobs.context import Job, JobContext

log = logging.getLogger(__name__)

SWEEP_JOB = "hydrant.batches.sweep"


async def run_batch(ctx: JobContext, batch_id: str) -> dict[str, Any]:
    """Work one batch to its end (its lease makes a second run of it a no-op)."""
    runner = batch_runner(ctx)
    if runner is None:
        log.info("batch left for a process that reaches the engines", extra={"batch_id": batch_id})
        return {"batch_id": batch_id, "outcome": "no engines reachable here"}
    return {"batch_id": batch_id, "outcome": await runner.run(batch_id)}


async def sweep_batches(ctx: JobContext) -> dict[str, Any]:
    """Enqueue a run of every batch with work and no live runner: how a batch resumes after
    its gateway or job worker died (once its lease lapses), and how a batch starts when
    its creation could not enqueue it."""
    async with ctx.database.session() as session:
        batch_ids = await repository.unleased(session, ctx.clock())
    for batch_id in batch_ids:
        ctx.enqueue(RUN_JOB, {"batch_id": batch_id})
    return {"enqueued": len(batch_ids)}


TASKS = (Job(RUN_JOB, run_batch, runtime=True), Job(SWEEP_JOB, sweep_batches))
