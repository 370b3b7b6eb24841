"""`hydrant jobs`: the Celery job worker and beat (issue #7)."""

from __future__ import annotations

import click

from hydrant.cli.context import not_yet


@click.group()
def jobs() -> None:
    """Celery job worker and beat: digests, rollups, spool replay, scale-to-zero."""


@jobs.command("worker")
def jobs_worker() -> None:
    """Run a Celery worker for Hydrant's jobs."""
    not_yet("the Celery job worker", 7)


@jobs.command("beat")
def jobs_beat() -> None:
    """Run Celery beat (the schedule of Hydrant's periodic jobs)."""
    not_yet("the Celery beat schedule", 7)
