"""`hydrant billing export|customer`: usage to a file, and the Stripe customer of a tenant.

Its own module beside the invoices' (hydrant/cli/billingcmd.py), which owns the `billing`
group and adds these two commands to it.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hydrant.cli.admin import _run
from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.console import AdminServices


def _moment(text: str, param: str, *, end_of_day: bool = False) -> datetime:
    from hydrant.platform.errors import InvalidRequest
    from hydrant.platform.reports.query import parse_moment

    try:
        return parse_moment(text, param=param, end_of_day=end_of_day)
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message, param_hint=f"--{param}") from None


@click.command("export")
@click.option("--since", required=True, help="Start (UTC), ISO date or datetime, inclusive.")
@click.option(
    "--until", help="End (UTC), exclusive; a plain date means through that day. Default: now."
)
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True
)
@click.option("--tenant", help="Only this tenant (id or name).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File (default: stdout).",
)
@pass_context
def billing_export(
    cli: CliContext,
    since: str,
    until: str | None,
    fmt: str,
    tenant: str | None,
    output: Path | None,
) -> None:
    """Per-hour usage (tenant, model, hour) summed from the ledger; progress on stderr."""
    from hydrant.platform.db.base import utcnow
    from hydrant.platform.usage_export.ledger_export import Formatter, hourly_usage

    start = _moment(since, "since")
    end = _moment(until, "until", end_of_day=True) if until else utcnow()
    if start >= end:
        raise click.BadParameter("must be earlier than --until", param_hint="--since")
    formatter = Formatter(fmt)

    def progress(day_start: datetime, day_end: datetime, rows: int) -> None:
        done = (day_end - start) / (end - start)
        click.echo(
            f"billing export: {day_start:%Y-%m-%d %H:%M} to {day_end:%Y-%m-%d %H:%M}:"
            f" {rows} rows ({done:.0%})",
            err=True,
        )

    async def work(s: AdminServices) -> int:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id if tenant else None
        stream = output.open("w", encoding="utf-8", newline="") if output else sys.stdout
        written = 0
        try:
            stream.write(formatter.header())
            async for row in hourly_usage(
                s.database, start, end, tenant_id=tenant_id, progress=progress
            ):
                stream.write(formatter.line(row))
                written += 1
        finally:
            if output:
                stream.close()
            else:
                stream.flush()
        return written

    written = _run(cli, work)
    click.echo(f"billing export: {written} rows written", err=True)


@click.command("customer")
@click.argument("tenant")
@click.argument("stripe_customer_id", required=False)
@click.option("--clear", is_flag=True, help="Remove the tenant's Stripe customer.")
@pass_context
def billing_customer(
    cli: CliContext, tenant: str, stripe_customer_id: str | None, clear: bool
) -> None:
    """TENANT's Stripe customer (for the `stripe` usage export): shown, set, or cleared.

    Records of a tenant with none wait in the outbox and go once it is set."""
    if clear and stripe_customer_id:
        raise click.UsageError("give a customer id or --clear, not both")

    async def work(s: AdminServices) -> str | None:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id
        if stripe_customer_id or clear:
            return await s.billing_customers.set(s.principal, tenant_id, stripe_customer_id)
        return await s.billing_customers.get(s.principal, tenant_id)

    click.echo(_run(cli, work) or "(none)")
