"""`hydrant tenants …` and `hydrant keys …`: the admin API's services, at the console.

Each command opens the configured database through `admin_services` (one unit
of work per command, `hydrant.platform.console`) and calls the same
services as `/admin`, as the console principal. A new key's secret is printed
once, alone on stdout, so `KEY=$(hydrant keys create --tenant acme)` captures
exactly the key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:  # the platform is imported inside the commands: `hydrant --help` stays fast
    from hydrant.platform.console import AdminServices

T = TypeVar("T")


def _run(cli: CliContext, work: Callable[[AdminServices], Awaitable[T]]) -> T:
    from sqlalchemy.exc import DBAPIError

    from hydrant.platform.console import admin_services
    from hydrant.platform.db import migrate
    from hydrant.platform.errors import DomainError

    settings = cli.settings()
    if settings.auto_migrate:
        migrate.upgrade(settings.effective_database_url)

    async def main() -> T:
        async with admin_services(settings) as services:
            return await work(services)

    try:
        return asyncio.run(main())
    except DomainError as exc:
        raise click.ClickException(exc.message) from None
    except msgspec.ValidationError as exc:
        raise click.UsageError(str(exc)) from None
    except DBAPIError as exc:
        raise click.ClickException(
            f"database error ({type(exc.orig).__name__}); is it reachable and migrated"
            " (`hydrant migrate`)?"
        ) from None


def _emit(rows: Iterable[msgspec.Struct], columns: tuple[str, ...], as_json: bool) -> None:
    items = [msgspec.to_builtins(row) for row in rows]
    if as_json:
        click.echo(msgspec.json.encode(items).decode())
        return
    click.echo("\t".join(columns))
    for item in items:
        click.echo("\t".join(_cell(item.get(column)) for column in columns))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


TENANT_COLUMNS = ("id", "name", "status", "plan_id", "timezone", "contact_email")
KEY_COLUMNS = (
    "id",
    "prefix",
    "tenant_id",
    "project_id",
    "scopes",
    "status",
    "name",
    "expires_at",
)
KEY_BUDGET_COLUMNS = (
    "id",
    "prefix",
    "tenant_id",
    "tokens_per_day",
    "tokens_per_month",
    "spend_per_day",
    "spend_per_month",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group()
def tenants() -> None:
    """Create, list, update and suspend tenants and their plans."""


@tenants.command("create")
@click.argument("name")
@click.option("--email", help="Contact address for cost digests.")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone of its days.")
@click.option("--plan", help="Plan id or name (default: the default plan).")
@json_option
@pass_context
def tenants_create(
    cli: CliContext, name: str, email: str | None, timezone: str, plan: str | None, as_json: bool
) -> None:
    """Create a tenant named NAME."""
    from hydrant.platform.tenants.schemas import TenantCreate, TenantView

    fields = {"name": name, "contact_email": email, "timezone": timezone, "plan": plan}

    async def work(s: AdminServices) -> TenantView:
        body = msgspec.convert(fields, TenantCreate)
        return TenantView.of(await s.tenants.create(s.principal, body))

    _emit([_run(cli, work)], TENANT_COLUMNS, as_json)


@tenants.command("list")
@click.option("--status", type=click.Choice(["active", "suspended"]))
@json_option
@pass_context
def tenants_list(cli: CliContext, status: str | None, as_json: bool) -> None:
    """List tenants with status and plan."""
    from hydrant.platform.tenants.schemas import TenantView

    async def work(s: AdminServices) -> list[TenantView]:
        found: list[TenantView] = []
        after: str | None = None
        while True:
            rows, more = await s.tenants.list(s.principal, limit=200, after=after, status=status)
            found.extend(TenantView.of(t) for t in rows)
            if not more:
                return found
            after = rows[-1].id

    _emit(_run(cli, work), TENANT_COLUMNS, as_json)


@tenants.command("show")
@click.argument("tenant")
@pass_context
def tenants_show(cli: CliContext, tenant: str) -> None:
    """Show TENANT (id or name) with its plan, as JSON."""
    from hydrant.platform.tenants.schemas import AccountView, PlanView, TenantView

    async def work(s: AdminServices) -> AccountView:
        row = await s.tenants.find(s.principal, tenant)
        plan = await s.tenants.plan_of(row)
        return AccountView(tenant=TenantView.of(row), plan=PlanView.of(plan))

    click.echo(msgspec.json.encode(_run(cli, work)).decode())


@tenants.command("update")
@click.argument("tenant")
@click.option("--name", help="New name.")
@click.option("--email", help="New contact address.")
@click.option("--no-email", is_flag=True, help="Remove the contact address.")
@click.option("--timezone", help="New IANA time zone.")
@click.option("--plan", help="Move to this plan (id or name).")
@json_option
@pass_context
def tenants_update(
    cli: CliContext, tenant: str, no_email: bool, as_json: bool, **fields: Any
) -> None:
    """Change TENANT's name, contact address, time zone or plan."""
    from hydrant.platform.tenants.schemas import TenantUpdate, TenantView

    given = {k: v for k, v in fields.items() if v is not None}
    if "email" in given:
        given["contact_email"] = given.pop("email")
    if no_email:
        given["contact_email"] = None

    async def work(s: AdminServices) -> TenantView:
        body = msgspec.convert(given, TenantUpdate)
        row = await s.tenants.find(s.principal, tenant)
        return TenantView.of(await s.tenants.update(s.principal, row.id, body))

    _emit([_run(cli, work)], TENANT_COLUMNS, as_json)


def _set_status(cli: CliContext, tenant: str, action: str) -> None:
    async def work(s: AdminServices) -> str:
        row = await s.tenants.find(s.principal, tenant)
        change = s.tenants.suspend if action == "suspend" else s.tenants.resume
        changed = await change(s.principal, row.id)
        return f"{changed.id}\t{changed.name}\t{changed.status}"

    click.echo(_run(cli, work))


@tenants.command("suspend")
@click.argument("tenant")
@pass_context
def tenants_suspend(cli: CliContext, tenant: str) -> None:
    """Suspend TENANT: its keys answer 403 until it is resumed."""
    _set_status(cli, tenant, "suspend")


@tenants.command("resume")
@click.argument("tenant")
@pass_context
def tenants_resume(cli: CliContext, tenant: str) -> None:
    """Resume a suspended TENANT."""
    _set_status(cli, tenant, "resume")


@click.group()
def keys() -> None:
    """Create, list, budget, revoke and rotate API keys (shown once, stored as hashes)."""


def _print_secret(
    secret: str, key: Any, as_json: bool, extra: dict[str, Any] | None = None
) -> None:
    if as_json:
        click.echo(msgspec.json.encode({"key": key, "secret": secret, **(extra or {})}).decode())
        return
    click.echo(f"{key.id} {key.prefix}… ({key.status}); the secret below is shown once:", err=True)
    click.echo(secret)


@keys.command("create")
@click.option("--tenant", help="Tenant id or name (an inference key).")
@click.option("--admin", "admin_key", is_flag=True, help="An admin key (no tenant).")
@click.option("--name", default="", help="A label, e.g. where the key is used.")
@click.option("--expires-in-days", type=click.IntRange(min=1), help="Expire after N days.")
@click.option("--project", help="The tenant's project the key belongs to (id or name).")
@click.option("--tokens-per-day", type=click.IntRange(min=0), help="The key's daily token budget.")
@click.option("--tokens-per-month", type=click.IntRange(min=0), help="Its monthly token budget.")
@click.option("--spend-per-day", help='The key\'s daily spend budget, e.g. "5.00".')
@click.option("--spend-per-month", help="The key's monthly spend budget.")
@json_option
@pass_context
def keys_create(
    cli: CliContext,
    tenant: str | None,
    admin_key: bool,
    name: str,
    expires_in_days: int | None,
    project: str | None,
    tokens_per_day: int | None,
    tokens_per_month: int | None,
    spend_per_day: str | None,
    spend_per_month: str | None,
    as_json: bool,
) -> None:
    """Create an API key for a tenant (or an admin key); prints its secret once."""
    from hydrant.platform.keys.schemas import KeyView

    if (tenant is None) == (not admin_key):
        raise click.UsageError("give exactly one of --tenant or --admin")
    expires = datetime.now(UTC) + timedelta(days=expires_in_days) if expires_in_days else None

    async def work(s: AdminServices) -> tuple[KeyView, str]:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id if tenant else None
        key, secret = await s.keys.create(
            s.principal,
            tenant_id=tenant_id,
            name=name,
            expires_at=expires,
            project=project,
            budgets={
                "tokens_per_day": tokens_per_day,
                "tokens_per_month": tokens_per_month,
                "spend_per_day": spend_per_day,
                "spend_per_month": spend_per_month,
            },
        )
        return KeyView.of(key, s.keys.now()), secret

    view, secret = _run(cli, work)
    _print_secret(secret, view, as_json)


@keys.command("list")
@click.option("--tenant", help="Only this tenant's keys (id or name).")
@click.option("--admin", "admin_keys", is_flag=True, help="Only admin keys.")
@json_option
@pass_context
def keys_list(cli: CliContext, tenant: str | None, admin_keys: bool, as_json: bool) -> None:
    """List keys (never their secrets)."""
    from hydrant.platform.keys.schemas import KeyView

    async def work(s: AdminServices) -> list[KeyView]:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id if tenant else None
        found: list[KeyView] = []
        after: str | None = None
        while True:
            rows, more = await s.keys.list(
                s.principal, tenant_id=tenant_id, admin_keys=admin_keys, limit=200, after=after
            )
            found.extend(KeyView.of(k, s.keys.now()) for k in rows)
            if not more:
                return found
            after = rows[-1].id

    _emit(_run(cli, work), KEY_COLUMNS, as_json)


BUDGET_NAMES = ("tokens-per-day", "tokens-per-month", "spend-per-day", "spend-per-month")


@keys.command("budgets")
@click.argument("key_id")
@click.option("--tokens-per-day", type=click.IntRange(min=0), help="New daily token budget.")
@click.option("--tokens-per-month", type=click.IntRange(min=0), help="New monthly token budget.")
@click.option("--spend-per-day", help='New daily spend budget, e.g. "5.00".')
@click.option("--spend-per-month", help="New monthly spend budget.")
@click.option(
    "--clear",
    "cleared",
    multiple=True,
    type=click.Choice(BUDGET_NAMES),
    help="Remove this budget (repeatable).",
)
@json_option
@pass_context
def keys_budgets(
    cli: CliContext,
    key_id: str,
    cleared: tuple[str, ...],
    as_json: bool,
    **given: int | str | None,
) -> None:
    """Set or clear KEY_ID's own budgets; those not named are unchanged. With none
    named, show them."""
    from hydrant.platform.keys.schemas import KeyUpdate, KeyView

    budgets: dict[str, int | str | None] = {k: v for k, v in given.items() if v is not None}
    for name in cleared:
        field = name.replace("-", "_")
        if field in budgets:
            raise click.UsageError(f"--{name} and --clear {name} contradict each other")
        budgets[field] = None

    async def work(s: AdminServices) -> KeyView:
        if not budgets:
            return KeyView.of(await s.keys.get(s.principal, key_id), s.keys.now())
        body = msgspec.convert(budgets, KeyUpdate)  # the API's checks, the API's errors
        key = await s.keys.update_budgets(s.principal, key_id, body.budgets())
        return KeyView.of(key, s.keys.now())

    _emit([_run(cli, work)], KEY_BUDGET_COLUMNS, as_json)


@keys.command("revoke")
@click.argument("key_id")
@pass_context
def keys_revoke(cli: CliContext, key_id: str) -> None:
    """Revoke KEY_ID now (gateways stop accepting it within the cache TTL)."""

    async def work(s: AdminServices) -> str:
        key = await s.keys.revoke(s.principal, key_id)
        return f"{key.id}\t{key.prefix}\trevoked"

    click.echo(_run(cli, work))


@keys.command("rotate")
@click.argument("key_id")
@click.option(
    "--grace-seconds",
    type=click.IntRange(0, 30 * 86400),
    default=86400,
    show_default=True,
    help="How long the old key keeps working.",
)
@json_option
@pass_context
def keys_rotate(cli: CliContext, key_id: str, grace_seconds: int, as_json: bool) -> None:
    """Replace KEY_ID by a new key; prints the new secret once."""
    from hydrant.platform.keys.schemas import KeyView

    async def work(s: AdminServices) -> tuple[KeyView, str, KeyView]:
        new, secret, old = await s.keys.rotate(
            s.principal, key_id, grace=timedelta(seconds=grace_seconds)
        )
        now = s.keys.now()
        return KeyView.of(new, now), secret, KeyView.of(old, now)

    new, secret, old = _run(cli, work)
    if not as_json:
        click.echo(f"{old.id} keeps working until {old.grace_until}", err=True)
    _print_secret(secret, new, as_json, {"previous": old})
