"""`hydrant credits grant|void|list|alerts`: a tenant's prepaid credits, at the console.

The same `CreditService` as `/admin/tenants/{id}/credits`, as the console principal.
Amounts are decimal strings (`12.50`), never floats. A tenant is named by id or name,
as the other groups accept.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import click
import msgspec

from hydrant.cli.admin import _emit, _run, json_option
from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.console import AdminServices

GRANT_COLUMNS = ("id", "kind", "amount", "used", "remaining", "currency", "expires_at",
                 "voided_at", "note")  # fmt: skip


@click.group("credits")
def credits_group() -> None:
    """Grant, void and list tenants' prepaid credits (for plans with `prepaid`)."""


@credits_group.command("grant")
@click.argument("tenant")
@click.argument("amount")
@click.option("--kind", type=click.Choice(["paid", "promo"]), default="paid", show_default=True)
@click.option("--currency", default="USD", show_default=True, help="ISO 4217 code.")
@click.option("--expires", type=click.DateTime(), help="When it expires (UTC), e.g. 2027-01-31.")
@click.option("--note", default="", help="What it is for (an invoice number, a campaign).")
@json_option
@pass_context
def credits_grant(
    cli: CliContext,
    tenant: str,
    amount: str,
    kind: str,
    currency: str,
    expires: datetime | None,
    note: str,
    as_json: bool,
) -> None:
    """Grant AMOUNT of credit (a decimal such as 25.00) to TENANT (id or name)."""
    from datetime import UTC

    from hydrant.platform.credits.schemas import GrantCreate, GrantView
    from hydrant.platform.prices.decimal_text import parse_decimal

    fields = {"kind": kind, "amount": amount, "currency": currency, "note": note}

    async def work(s: AdminServices) -> GrantView:
        body = msgspec.convert(fields, GrantCreate)
        value = parse_decimal(body.amount, param="amount", places=6, integer_digits=10)
        row = await s.tenants.find(s.principal, tenant)
        expires_at = expires.replace(tzinfo=UTC) if expires is not None else None
        granted = await s.credits.grant(
            s.principal,
            row.id,
            kind=body.kind,
            amount=value,
            currency=body.currency,
            expires_at=expires_at,
            note=body.note,
        )
        return GrantView.of(*granted)

    _emit([_run(cli, work)], GRANT_COLUMNS, as_json)


@credits_group.command("void")
@click.argument("tenant")
@click.argument("grant_id")
@json_option
@pass_context
def credits_void(cli: CliContext, tenant: str, grant_id: str, as_json: bool) -> None:
    """Void GRANT_ID of TENANT: what is left of it can no longer be spent."""
    from hydrant.platform.credits.schemas import GrantView

    async def work(s: AdminServices) -> GrantView:
        row = await s.tenants.find(s.principal, tenant)
        return GrantView.of(*await s.credits.void(s.principal, row.id, grant_id))

    _emit([_run(cli, work)], GRANT_COLUMNS, as_json)


@credits_group.command("list")
@click.argument("tenant")
@json_option
@pass_context
def credits_list(cli: CliContext, tenant: str, as_json: bool) -> None:
    """TENANT's grants and its available balance (last line)."""
    from hydrant.platform.credits.schemas import BalanceView

    async def work(s: AdminServices) -> BalanceView:
        row = await s.tenants.find(s.principal, tenant)
        return BalanceView.of(await s.credits.balance(s.principal, row.id))

    balance = _run(cli, work)
    if as_json:
        click.echo(msgspec.json.encode(balance).decode())
        return
    _emit(balance.grants, GRANT_COLUMNS, False)
    click.echo(f"available\t{balance.available}\t{balance.currency}")


@credits_group.command("alerts")
@click.argument("tenant")
@click.option(
    "--set",
    "amounts",
    multiple=True,
    help="A low-balance threshold (decimal, the credits' currency); repeat for several.",
)
@click.option("--clear", is_flag=True, help="Remove every threshold (no low-balance mail).")
@json_option
@pass_context
def credits_alerts(
    cli: CliContext, tenant: str, amounts: tuple[str, ...], clear: bool, as_json: bool
) -> None:
    """TENANT's low-balance alert thresholds: shown, or replaced with --set/--clear.

    Each is mailed to the tenant's digest recipients once each time the balance falls
    under it, and re-armed once the balance is back at or above it (a new grant)."""
    from hydrant.platform.credits.schemas import AlertThresholdsUpdate, AlertThresholdsView
    from hydrant.platform.prices.decimal_text import parse_decimal

    if clear and amounts:
        raise click.UsageError("--set and --clear exclude each other")

    async def work(s: AdminServices) -> AlertThresholdsView:
        row = await s.tenants.find(s.principal, tenant)
        if amounts or clear:
            body = msgspec.convert({"thresholds": list(amounts)}, AlertThresholdsUpdate)
            values = [
                parse_decimal(a, param="thresholds", places=6, integer_digits=10, positive=True)
                for a in body.thresholds
            ]
            currency, rows = await s.credits.set_alert_thresholds(s.principal, row.id, values)
        else:
            currency, rows = await s.credits.alert_thresholds(s.principal, row.id)
        return AlertThresholdsView.of(row.id, currency, rows)

    view = _run(cli, work)
    if as_json:
        click.echo(msgspec.json.encode(view).decode())
        return
    _emit(view.thresholds, ("amount", "below", "crossings"), False)
