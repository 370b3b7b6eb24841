"""`hydrant report`: the admin cost report at the console, as a table, JSON or CSV.

The same query parser, service and views as `GET /admin/reports/costs`, run
as the console principal (admin rights, no key) over the configured
database, so the console and the API can never disagree on a number.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click
import msgspec

from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.reports.schemas import CostReportView, CostRow, CostTotals


HEADER = ("bucket", "tenant", "model", "requests", "input", "cached", "output", "charged",
          "batch", "device_s", "device_cost", "margin")  # fmt: skip
NUMBER_FIELDS = ("requests", "input_tokens", "cached_tokens", "output_tokens", "charged",
                 "batch_charged", "device_seconds", "device_cost", "margin")  # fmt: skip
TEXT_COLUMNS = 3  # bucket, tenant, model: left-aligned; the numbers are right-aligned


def _numbers(item: CostRow | CostTotals) -> list[str]:
    return [str(getattr(item, name)) for name in NUMBER_FIELDS]


def render_table(view: CostReportView) -> str:
    """Aligned columns with a totals line; money as in the JSON view."""
    hourly = view.period.group_by == "hour"
    lines = [list(HEADER)]
    for row in view.data:
        bucket = row.bucket[:16].replace("T", " ") if hourly else row.bucket[:10]
        numbers = _numbers(row)
        if row.device_cost_estimated:  # an upstream pool's: the gateway's estimate
            at = NUMBER_FIELDS.index("device_cost")
            numbers[at] = "~" + numbers[at]
        lines.append([bucket, row.tenant_id, row.model, *numbers])
    totals = view.totals
    lines.append(["total", "", "", *_numbers(totals)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    rendered = [
        "  ".join(
            cell.ljust(widths[i]) if i < TEXT_COLUMNS else cell.rjust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()
        for line in lines
    ]
    period = view.period
    title = f"costs from {period.since} to {period.until} (exclusive) by {period.group_by}"
    rounded = totals.rounded
    footer = (
        f"total charged {rounded.charged} (batch {rounded.batch_charged}), device cost"
        f" {rounded.device_cost}, margin {rounded.margin} (rounded to cents)"
    )
    if any(row.device_cost_estimated for row in view.data):
        footer += "\n~ device cost estimated: upstream servers report no device time"
    return "\n".join([title, *rendered, footer])


async def _run(
    database_url: str,
    *,
    since: str | None,
    until: str | None,
    tenant: str | None,
    model: str | None,
    group_by: str,
    output_format: str,
    estimated_models: frozenset[str] = frozenset(),
) -> str:
    from hydrant.platform.auth.principal import CONSOLE
    from hydrant.platform.db.base import utcnow
    from hydrant.platform.reports.csv_export import cost_report_csv
    from hydrant.platform.reports.query import build_query
    from hydrant.platform.reports.schemas import CostReportView
    from hydrant.platform.reports.service import open_report_service

    async with open_report_service(database_url, estimated_models) as reports:
        tenant_id = await reports.tenant_id_for(CONSOLE, tenant) if tenant else None
        query = build_query(
            now=utcnow(),
            since=since,
            until=until,
            group_by=group_by,
            tenant_id=tenant_id,
            model=model,
        )
        report = await reports.costs(CONSOLE, query)
    if output_format == "csv":
        return cost_report_csv(report).replace("\r\n", "\n").rstrip("\n")
    view = CostReportView.of(report)
    if output_format == "json":
        return msgspec.json.format(msgspec.json.encode(view), indent=2).decode()
    return render_table(view)


@click.command()
@click.option(
    "--since", metavar="DATE|DATETIME", help="Start (UTC, inclusive); default: 7 days ago."
)
@click.option(
    "--until",
    metavar="DATE|DATETIME",
    help="End (UTC): a date counts through that day, a datetime is exclusive; default: now.",
)
@click.option("--tenant", metavar="ID|NAME", help="Only this tenant (its id or name).")
@click.option("--model", metavar="NAME", help="Only this model.")
@click.option(
    "--by", "group_by", type=click.Choice(["day", "hour"]), default="day", show_default=True,
    help="Bucket size, by `finished_at` in UTC.",
)  # fmt: skip
@click.option(
    "--format", "output_format", type=click.Choice(["table", "json", "csv"]), default="table",
    show_default=True,
)  # fmt: skip
@pass_context
def report(
    cli: CliContext,
    since: str | None,
    until: str | None,
    tenant: str | None,
    model: str | None,
    group_by: str,
    output_format: str,
) -> None:
    """Cost report by tenant, model and day/hour, as a table, JSON or CSV.

    Per bucket, tenant and model: requests, tokens in / cached / out, charged,
    device seconds, device cost and margin; totals are exact sums of the
    ledger's charges, rounded to cents only in the last line.
    """
    from sqlalchemy.exc import DBAPIError

    from hydrant.platform.errors import DomainError

    settings = cli.settings()
    try:
        text = asyncio.run(
            _run(
                settings.effective_database_url,
                since=since,
                until=until,
                tenant=tenant,
                model=model,
                group_by=group_by,
                output_format=output_format,
                estimated_models=frozenset(settings.upstream_pools()),
            )
        )
    except DomainError as exc:
        if exc.status == 400:
            option = {"group_by": "by"}.get(exc.param or "", exc.param or "")
            raise click.UsageError(
                f"--{option}: {exc.message}" if option else exc.message
            ) from None
        raise click.ClickException(exc.message) from None
    except DBAPIError as exc:
        raise click.ClickException(
            f"cannot read the ledger ({type(exc.orig).__name__}); is the database migrated?"
            " Run `hydrant migrate`."
        ) from None
    click.echo(text)
