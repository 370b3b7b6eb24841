"""The batch jobs without a gateway: the sweep starts every batch no runner holds, a run
in a process that cannot reach the engines leaves the batch alone, and a Celery worker
opens the job's runtime (worker pools) only for the jobs that need one."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from hydrant.platform.batches.tasks import run_batch, sweep_batches
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Batch, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.celery_app import make_celery
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.services import open_job_runtime
from hydrant.settings import load_settings


def _batch(batch_id: str, status: str, lease_s: float | None) -> Batch:
    now = utcnow()
    return Batch(
        id=batch_id,
        tenant_id="ten_a",
        endpoint="/v1/chat/completions",
        model="demo",
        input_file_id="file-x",
        status=status,
        expires_at=now + timedelta(hours=24),
        lease_owner=None if lease_s is None else "someone",
        lease_until=None if lease_s is None else now + timedelta(seconds=lease_s),
    )


async def test_the_sweep_starts_the_batches_no_runner_holds(db: Database, tmp_path: Path) -> None:
    async with db.session() as session:
        session.add(Tenant(id="ten_a", name="a"))
        await session.flush()
        session.add_all(
            [
                _batch("batch_new", "in_progress", None),  # never started
                _batch("batch_dead", "in_progress", -5),  # its runner died
                _batch("batch_live", "in_progress", 20),  # a runner works it
                _batch("batch_stop", "cancelling", None),  # to be finished
                _batch("batch_done", "completed", None),
            ]
        )
    queued: list[tuple[str, dict[str, Any]]] = []
    ctx = JobContext(
        load_settings({}, data_dir=tmp_path), db, None, lambda n, kw: queued.append((n, kw))
    )  # type: ignore[arg-type]
    assert await sweep_batches(ctx) == {"enqueued": 3}
    assert sorted(kw["batch_id"] for _, kw in queued) == ["batch_dead", "batch_new", "batch_stop"]
    assert {name for name, _ in queued} == {"hydrant.batches.run"}
    outcome = await run_batch(ctx, "batch_new")  # no runtime here: the batch is left alone
    assert outcome["outcome"] == "no engines reachable here"
    async with db.session() as session:
        assert (
            await session.scalar(select(Batch.lease_owner).where(Batch.id == "batch_new")) is None
        )
    async with open_job_runtime(ctx) as runtime:
        assert runtime is None  # no worker pools configured: job workers cannot reach engines


def test_a_celery_worker_opens_a_runtime_only_for_the_jobs_that_need_one(tmp_path: Path) -> None:
    from hydrant.platform.db import migrate

    settings = load_settings({}, data_dir=tmp_path, redis_url="redis://127.0.0.1:1/5")
    migrate.upgrade(settings.effective_database_url)
    opened: list[str] = []

    @asynccontextmanager
    async def runtime(ctx: JobContext) -> Any:
        opened.append("open")
        yield "a runtime"

    app = make_celery(settings, JOB_TABLE, runtime=runtime)
    assert app.tasks["hydrant.batches.run"].run(batch_id="batch_nope") == {
        "batch_id": "batch_nope",
        "outcome": "no engines reachable here",  # a runtime, but not a batch runner
    }
    assert opened == ["open"]
    assert app.tasks["hydrant.files.purge"].run() == {"deleted": 0, "orphans_removed": 0}
    assert opened == ["open"]  # not for a job that needs none


def test_a_gateway_with_its_own_engines_runs_its_batches_even_beside_celery(
    tmp_path: Path,
) -> None:
    from hydrant.platform.batches.runner import BatchRunner
    from hydrant.platform.job_table import BATCH_PERIODIC
    from hydrant.platform.jobs.scheduler import EmbeddedScheduler
    from hydrant.platform.models.registry import ModelRegistry
    from hydrant.platform.quotas import InMemoryQuotaBackend
    from hydrant.platform.services import build_services

    folders = (tmp_path / str(n) for n in range(3))  # each gateway its own data folder

    def schedulers(**settings: Any) -> list[EmbeddedScheduler]:
        config = load_settings({}, data_dir=next(folders), **settings)
        services = build_services(
            config, registry=ModelRegistry(), quota_backend=InMemoryQuotaBackend(), run_jobs=True
        )
        assert services.inference is not None
        services.inference.spool.close()  # built, never started
        found = [s for s in services.background if isinstance(s, EmbeddedScheduler)]
        for scheduler in found:
            assert isinstance(scheduler.context.runtime, BatchRunner)
        return found

    (embedded,) = schedulers()  # no Redis: every job, batches too, on the gateway's loop
    assert "hydrant.batches.sweep" in {p.job for p in embedded.periodic}
    assert len(embedded.periodic) > len(BATCH_PERIODIC)
    (beside_celery,) = schedulers(redis_url="redis://127.0.0.1:1/5")  # Celery runs the rest
    assert beside_celery.periodic == BATCH_PERIODIC
    assert schedulers(embedded_jobs=False) == []  # switched off: nothing runs here
