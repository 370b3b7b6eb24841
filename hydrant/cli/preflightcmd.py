"""`hydrant preflight`: the launch checklist against a live deployment (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click


@click.command()
@click.option(
    "--url", required=True, help="Base URL of the deployment, e.g. http://127.0.0.1:8000."
)
@click.option(
    "--admin-key",
    required=True,
    envvar="HYDRANT_PREFLIGHT_ADMIN_KEY",
    help="An admin key (or HYDRANT_PREFLIGHT_ADMIN_KEY, which keeps it out of `ps`).",
)
@click.option(
    "--metrics-token",
    envvar="HYDRANT_PREFLIGHT_METRICS_TOKEN",
    help="The deployment's HYDRANT_METRICS_TOKEN, when its /metrics requires one.",
)
@click.option("--model", help="Model to check (default: the first one /v1/models lists).")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The log file the deployment writes (HYDRANT_LOG_FILE): scanned for canaries.",
)
@click.option(
    "--infra",
    "infra_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder with the alert rules and dashboards (default: ./infra when it exists).",
)
@click.option("--only", help="Comma-separated check names to run (default: all).")
@click.option(
    "--tail-factor",
    type=float,
    default=3.0,
    show_default=True,
    help="Short requests' p99 with long prompts in flight: at most this x their solo p99.",
)
@click.option(
    "--batch-factor",
    type=float,
    default=4.0,
    show_default=True,
    help="Tokens per engine step in a burst: at least this x a lone request's.",
)
@click.option(
    "--cold-start-sla",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds a pool at zero may take to answer its first request.",
)
@click.option(
    "--rollback-to",
    type=click.Path(path_type=Path),
    help="Pools: the previous checkpoint, for the rollback drill (swap to it and back).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def preflight(
    url: str,
    admin_key: str,
    metrics_token: str | None,
    model: str | None,
    log_file: Path | None,
    infra_dir: Path | None,
    only: str | None,
    tail_factor: float,
    batch_factor: float,
    cold_start_sla: float,
    rollback_to: Path | None,
    as_json: bool,
) -> None:
    """Run the launch checklist against URL: a table of PASS/FAIL/SKIP with measured values.

    Exit code 1 when any check fails, 2 when the deployment cannot be checked
    at all. It creates a throwaway tenant and key and suspends the tenant at
    the end. The checks send a few hundred small requests: run it before
    opening traffic, not on a deployment at capacity.
    """
    from hydrant.platform.preflight import CHECK_NAMES, PreflightOptions, run_preflight
    from hydrant.platform.preflight.report import as_json as results_json
    from hydrant.platform.preflight.report import failed, format_table
    from hydrant.platform.preflight.session import PreflightError

    chosen = None
    if only:
        chosen = frozenset(name.strip() for name in only.split(",") if name.strip())
        unknown = sorted(chosen - set(CHECK_NAMES))
        if unknown:
            raise click.UsageError(
                f"unknown checks: {', '.join(unknown)} (known: {', '.join(CHECK_NAMES)})"
            )
    options = PreflightOptions(
        model=model,
        metrics_token=metrics_token,
        log_file=log_file,
        infra_dir=infra_dir,
        only=chosen,
        tail_factor=tail_factor,
        batch_factor=batch_factor,
        cold_start_sla_s=cold_start_sla,
        rollback_to=rollback_to,
    )
    try:
        results = asyncio.run(
            run_preflight(url, admin_key, options, progress=lambda m: click.echo(m, err=True))
        )
    except PreflightError as exc:
        click.echo(f"hydrant preflight: {exc}", err=True)
        raise SystemExit(2) from None
    if as_json:
        click.echo(json.dumps(results_json(url, results), indent=2))
    else:
        click.echo(format_table(results))
    if failed(results):
        raise SystemExit(1)
