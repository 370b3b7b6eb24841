"""Command families whose features land with later issues: real help, honest refusal."""

from __future__ import annotations

import click

from hydrant.cli.context import not_yet


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", help="Model name to serve (a pool of the gateway).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--port", type=int, help="Port of the worker's internal HTTP API.")
def worker(model: str | None, device: str, port: int | None) -> None:
    """Run one engine worker: one model on one device, registered in Redis.

    The gateway dispatches to pools of these processes; they scale to zero
    and wake with weights kept warm in host memory.
    """
    not_yet("the engine worker process", 6)


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
