"""`hydrant worker`: one engine on one device, serving a model's pool (issue #6)."""

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
