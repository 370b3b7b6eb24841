"""`hydrant jobs`: the Celery job worker and beat, and running one job by hand.

Worker and beat need Redis (`HYDRANT_REDIS_URL`); on the embedded default the
same jobs run inside `hydrant serve`, and `hydrant jobs run` runs one now
in this process, with or without Redis.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from hydrant.cli.context import CliContext, pass_context
from hydrant.settings import Settings


def _celery(settings: Settings) -> Any:
    from hydrant.platform.job_table import JOB_TABLE
    from hydrant.platform.jobs.celery_app import make_celery
    from hydrant.platform.services import open_job_runtime

    # A ConfigurationError: a usage error (HydrantGroup). Batches' lines run through worker
    # pools when the settings name some (`open_job_runtime`).
    return make_celery(settings, JOB_TABLE, runtime=open_job_runtime)


@click.group()
def jobs() -> None:
    """Celery job worker and beat: digests, budget alerts, rollups, spool replay."""


@jobs.command("worker")
@click.option("--concurrency", type=int, default=2, show_default=True, help="Tasks at once.")
@click.option(
    "--pool",
    type=click.Choice(["prefork", "threads", "solo"]),
    default="prefork",
    show_default=True,
    help="Celery execution pool.",
)
@click.option("--loglevel", default="INFO", show_default=True, help="Celery's log level.")
@pass_context
def jobs_worker(cli: CliContext, concurrency: int, pool: str, loglevel: str) -> None:
    """Run a Celery worker for Hydrant's jobs (needs HYDRANT_REDIS_URL)."""
    app = _celery(cli.settings())
    app.worker_main(
        argv=["worker", f"--concurrency={concurrency}", f"--pool={pool}", f"--loglevel={loglevel}"]
    )


@jobs.command("beat")
@click.option(
    "--schedule",
    "schedule_file",
    type=click.Path(path_type=Path),
    help="Beat's state file (default: <data dir>/celerybeat-schedule).",
)
@click.option("--loglevel", default="INFO", show_default=True, help="Celery's log level.")
@pass_context
def jobs_beat(cli: CliContext, schedule_file: Path | None, loglevel: str) -> None:
    """Run Celery beat: the schedule of Hydrant's periodic jobs (needs HYDRANT_REDIS_URL)."""
    settings = cli.settings()
    app = _celery(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    schedule = schedule_file or settings.data_dir / "celerybeat-schedule"
    app.Beat(schedule=str(schedule), loglevel=loglevel).run()


@jobs.command("run")
@click.argument("name")
@click.option("--arg", "args", multiple=True, metavar="KEY=VALUE", help="A job argument.")
@pass_context
def jobs_run(cli: CliContext, name: str, args: tuple[str, ...]) -> None:
    """Run one job now, in this process (e.g. hydrant.digests.dispatch); prints its result."""
    from hydrant.platform.job_table import JOB_TABLE
    from hydrant.platform.jobs.context import open_job_context
    from hydrant.platform.services import open_job_runtime

    jobs_by_name = JOB_TABLE.jobs
    if name not in jobs_by_name:
        raise click.UsageError(f"no job {name!r}; jobs: {', '.join(sorted(jobs_by_name))}")
    kwargs: dict[str, Any] = {}
    for item in args:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--arg {item!r} must look like KEY=VALUE")
        kwargs[key] = value
    settings = cli.settings()
    queued: list[tuple[str, dict[str, Any]]] = []

    async def run() -> Any:
        async with open_job_context(settings, lambda n, kw: queued.append((n, kw))) as ctx:
            if jobs_by_name[name].runtime:  # a batch's lines: through worker pools, if any
                async with open_job_runtime(ctx) as runtime:
                    ctx.runtime = runtime
                    return await jobs_by_name[name].fn(ctx, **kwargs)
            result = await jobs_by_name[name].fn(ctx, **kwargs)
            # What the job enqueued runs here too, in order, so one command does the work.
            while queued:
                follow, follow_kwargs = queued.pop(0)
                click.echo(json.dumps({"job": follow, **follow_kwargs}), err=True)
                await jobs_by_name[follow].fn(ctx, **follow_kwargs)
            return result

    click.echo(json.dumps(asyncio.run(run()), default=str))


@jobs.command("stuck-digests")
@click.option(
    "--resend",
    "send_id",
    metavar="SEND_ID",
    help="Release this stuck send and mail its digest again now (check the mail log first).",
)
@pass_context
def jobs_stuck_digests(cli: CliContext, send_id: str | None) -> None:
    """List digest sends a worker left `sending`, or re-send one (as /admin/digests/stuck)."""
    import msgspec

    from hydrant.platform.digests.deps import digest_service
    from hydrant.platform.digests.schemas import DigestResend, StuckDigestSend
    from hydrant.platform.errors import DomainError
    from hydrant.platform.jobs.context import open_job_context

    settings = cli.settings()

    async def run() -> list[Any]:
        """The same objects `/admin/digests/stuck` answers with."""
        async with open_job_context(settings, lambda name, kwargs: None) as ctx:
            digests = digest_service(ctx)
            if send_id is not None:
                result = await digests.resend_stuck(send_id)
                return [
                    DigestResend(id=send_id, outcome=result.outcome, recipients=result.recipients)
                ]
            return [StuckDigestSend.of(s) for s in await digests.stuck_sends()]

    try:
        rows = asyncio.run(run())
    except DomainError as exc:
        raise click.UsageError(exc.message) from None
    for row in rows:
        click.echo(msgspec.json.encode(row).decode())


@jobs.command("digest")
@click.argument("tenant")
@click.option(
    "--to",
    "recipients",
    multiple=True,
    metavar="EMAIL",
    help="Recipient (repeatable; replaces the list).",
)
@click.option("--hour", type=click.IntRange(0, 23), help="Local hour the digest goes out.")
@click.option("--timezone", "zone", help="IANA time zone of that hour, e.g. Europe/Berlin.")
@click.option("--enable/--disable", "enabled", default=None, help="Send the digest or not.")
@pass_context
def jobs_digest(
    cli: CliContext,
    tenant: str,
    recipients: tuple[str, ...],
    hour: int | None,
    zone: str | None,
    enabled: bool | None,
) -> None:
    """Show or change a tenant's daily digest (the same as PUT /admin/tenants/{id}/digest)."""
    import msgspec

    from hydrant.platform.auth.principal import CONSOLE
    from hydrant.platform.db.session import Database
    from hydrant.platform.digests.schemas import DigestSettingsUpdate
    from hydrant.platform.digests.service import DigestSettingsService
    from hydrant.platform.errors import DomainError
    from hydrant.platform.tenants.repository import find_tenant

    fields: dict[str, Any] = {}
    if recipients:
        fields["recipients"] = list(recipients)
    if hour is not None:
        fields["send_hour"] = hour
    if zone is not None:
        fields["timezone"] = zone
    if enabled is not None:
        fields["enabled"] = enabled
    settings = cli.settings()

    async def run() -> Any:
        database = Database(settings.effective_database_url)
        try:
            async with database.session() as session:
                found = await find_tenant(session, CONSOLE, tenant)
                if found is None:
                    raise click.UsageError(f"no tenant {tenant!r}")
                service = DigestSettingsService(session)
                if fields:
                    return await service.update(CONSOLE, found.id, DigestSettingsUpdate(**fields))
                return await service.view(CONSOLE, found.id)
        finally:
            await database.dispose()

    try:
        view = asyncio.run(run())
    except DomainError as exc:
        raise click.UsageError(exc.message) from None
    click.echo(msgspec.json.encode(view).decode())
