"""`hydrant billing invoices list|show|finalize`: tenants' monthly invoices, at the console.

The same `InvoiceService` as `/admin/tenants/{id}/invoices` and
`POST /admin/invoices/finalize`, as the console principal. A tenant is named by id or
name; an invoice by id (`inv_…`) or month (`2026-11`: its invoice, else its draft).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

from hydrant.cli.admin import _emit, _run, json_option
from hydrant.cli.billingexport import billing_customer, billing_export
from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.console import AdminServices
    from hydrant.platform.invoices.statement import InvoiceDoc

INVOICE_COLUMNS = ("id", "number", "status", "period", "currency", "subtotal",
                   "credits_applied", "amount_due")  # fmt: skip
LINE_COLUMNS = ("description", "requests", "input_tokens", "cached_input_tokens",
                "output_tokens", "amount", "credits_applied")  # fmt: skip


@click.group("billing")
def billing() -> None:
    """Billing: tenants' monthly invoices, usage export to a file, tenants' Stripe customers."""


@billing.group("invoices")
def invoices() -> None:
    """List, show and finalize monthly invoices (drafts are computed from the ledger)."""


@invoices.command("list")
@click.argument("tenant")
@json_option
@pass_context
def invoices_list(cli: CliContext, tenant: str, as_json: bool) -> None:
    """TENANT's open month's draft, then its finalized invoices, newest first."""
    from hydrant.platform.invoices.schemas import InvoiceView

    async def work(s: AdminServices) -> list[InvoiceView]:
        row = await s.tenants.find(s.principal, tenant)
        return [InvoiceView.of(doc) for doc in await s.invoices.list(s.principal, row.id)]

    _emit(_run(cli, work), INVOICE_COLUMNS, as_json)


@invoices.command("show")
@click.argument("tenant")
@click.argument("invoice")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv", "html", "pdf"]),
    default="table",
    show_default=True,
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file (needed for pdf).",
)
@pass_context
def invoices_show(
    cli: CliContext, tenant: str, invoice: str, fmt: str, output: Path | None
) -> None:
    """TENANT's INVOICE (an id, or a month such as 2026-11) with its lines and totals."""
    from hydrant.platform.invoices.render import invoice_csv, invoice_html, invoice_pdf
    from hydrant.platform.invoices.schemas import InvoiceView

    if fmt == "pdf" and output is None:
        raise click.UsageError("--format pdf needs --output FILE")

    async def work(s: AdminServices) -> InvoiceDoc:
        row = await s.tenants.find(s.principal, tenant)
        return await s.invoices.get(s.principal, row.id, invoice)

    doc = _run(cli, work)
    content: str | bytes
    if fmt == "pdf":
        content = invoice_pdf(doc)
    elif fmt == "csv":
        content = invoice_csv(doc)
    elif fmt == "html":
        content = invoice_html(doc)
    elif fmt == "json":
        content = msgspec.json.encode(InvoiceView.of(doc)).decode()
    else:
        view = InvoiceView.of(doc)
        head = f"{doc.title} · {view.status} · {view.period} ({view.timezone}) · {view.currency}"
        table = [head, "\t".join(LINE_COLUMNS)]
        table += ["\t".join(str(getattr(line, c)) for c in LINE_COLUMNS) for line in view.lines]
        table += [
            f"subtotal\t{view.subtotal}",
            f"credits_applied\t{view.credits_applied}",
            f"amount_due\t{view.amount_due}",
        ]
        content = "\n".join(table)
    if output is not None:
        output.write_bytes(content if isinstance(content, bytes) else content.encode())
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(content)


@invoices.command("finalize")
@click.option("--month", help="YYYY-MM (default: each tenant's last month in its own zone).")
@json_option
@pass_context
def invoices_finalize(cli: CliContext, month: str | None, as_json: bool) -> None:
    """Finalize a closed month's invoices: numbered, frozen, their mails claimed (sent by
    the invoices job). Idempotent; a tenant whose month has not ended is left open."""
    from hydrant.platform.invoices.periods import Month
    from hydrant.platform.invoices.schemas import FinalizeView

    def progress(done: int, total: int) -> None:
        click.echo(f"\rtenants {done}/{total}", nl=done == total, err=True)

    async def work(s: AdminServices) -> FinalizeView:
        target = Month.parse(month) if month is not None else None
        return FinalizeView.of(month, await s.invoices.finalize(target, progress))

    view = _run(cli, work)
    if as_json:
        click.echo(msgspec.json.encode(view).decode())
        return
    click.echo(
        f"created {len(view.created)}, already finalized {len(view.existing)},"
        f" nothing to bill {view.empty}, month still open {view.still_open},"
        f" failed {len(view.failed)}"
    )
    for invoice_id in view.created:
        click.echo(invoice_id)


billing.add_command(billing_export)
billing.add_command(billing_customer)
