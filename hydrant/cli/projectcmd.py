"""`hydrant projects add|list|archive`: a tenant's projects, at the console.

The same service as `/admin/tenants/{id}/projects`, as the console principal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from hydrant.cli.admin import _emit, _run, json_option
from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.console import AdminServices
    from hydrant.platform.projects.schemas import ProjectView

PROJECT_COLUMNS = (
    "id",
    "tenant_id",
    "name",
    "status",
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_day",
    "tokens_per_month",
    "spend_per_day",
    "spend_per_month",
)


@click.group()
def projects() -> None:
    """Add, list and archive a tenant's projects (attribution and budgets below it)."""


@projects.command("add")
@click.argument("tenant")
@click.argument("name")
@click.option("--requests-per-minute", type=click.IntRange(min=0), help="Request rate.")
@click.option("--tokens-per-minute", type=click.IntRange(min=0), help="Token rate.")
@click.option("--tokens-per-day", type=click.IntRange(min=0), help="Daily token budget.")
@click.option("--tokens-per-month", type=click.IntRange(min=0), help="Monthly token budget.")
@click.option("--spend-per-day", help='Daily spend budget, e.g. "5.00".')
@click.option("--spend-per-month", help='Monthly spend budget, e.g. "100.00".')
@json_option
@pass_context
def projects_add(
    cli: CliContext,
    tenant: str,
    name: str,
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    tokens_per_day: int | None,
    tokens_per_month: int | None,
    spend_per_day: str | None,
    spend_per_month: str | None,
    as_json: bool,
) -> None:
    """Add a project NAME to TENANT (id or name), with optional rates and budgets."""
    from hydrant.platform.projects.schemas import ProjectCreate, ProjectView

    fields = {
        "name": name,
        "requests_per_minute": requests_per_minute,
        "tokens_per_minute": tokens_per_minute,
        "tokens_per_day": tokens_per_day,
        "tokens_per_month": tokens_per_month,
        "spend_per_day": spend_per_day,
        "spend_per_month": spend_per_month,
    }

    async def work(s: AdminServices) -> ProjectView:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id
        body = msgspec.convert(fields, ProjectCreate)
        return ProjectView.of(await s.projects.create(s.principal, tenant_id, body))

    _emit([_run(cli, work)], PROJECT_COLUMNS, as_json)


@projects.command("list")
@click.argument("tenant")
@click.option("--archived", is_flag=True, help="Include archived projects.")
@json_option
@pass_context
def projects_list(cli: CliContext, tenant: str, archived: bool, as_json: bool) -> None:
    """List TENANT's projects."""
    from hydrant.platform.projects.schemas import ProjectView

    async def work(s: AdminServices) -> list[ProjectView]:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id
        rows = await s.projects.list(s.principal, tenant_id, archived=archived)
        return [ProjectView.of(p) for p in rows]

    _emit(_run(cli, work), PROJECT_COLUMNS, as_json)


@projects.command("archive")
@click.argument("tenant")
@click.argument("project")
@pass_context
def projects_archive(cli: CliContext, tenant: str, project: str) -> None:
    """Archive PROJECT (id or name) of TENANT: no new keys join it; its history stays."""

    async def work(s: AdminServices) -> ProjectView:
        from hydrant.platform.projects.schemas import ProjectView

        tenant_id = (await s.tenants.find(s.principal, tenant)).id
        return ProjectView.of(await s.projects.archive(s.principal, tenant_id, project))

    view = _run(cli, work)
    click.echo(f"archived {view.id} ({view.name})")
