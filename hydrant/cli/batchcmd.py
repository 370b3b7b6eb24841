"""`hydrant batches list|show|cancel`: every tenant's Batch API batches, at the console.

The same `BatchBook` as `/v1/batches` and the `/ui` pages, as the console principal
(every tenant's batches). A cancel here is what `POST /v1/batches/{id}/cancel` does:
the batch's runner, on whichever gateway or job worker holds it, stops within a
second; with no runner, the next sweep finishes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
import msgspec

from hydrant.cli.admin import _emit, _run, json_option
from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.console import AdminServices

# OpenAI's statuses (db.batch_models.BATCH_STATUSES; not imported: `--help` stays fast).
STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired",
            "cancelling", "cancelled")  # fmt: skip
BATCH_COLUMNS = ("id", "tenant_id", "status", "model", "endpoint", "total", "completed",
                 "failed", "created_at")  # fmt: skip


class BatchRow(msgspec.Struct, kw_only=True):
    """A batch as the console lists it (times in ISO 8601, counts flat)."""

    id: str
    tenant_id: str
    status: str
    model: str
    endpoint: str
    total: int
    completed: int
    failed: int
    created_at: str

    @classmethod
    def of(cls, batch: Any) -> BatchRow:
        return cls(
            id=batch.id,
            tenant_id=batch.tenant_id,
            status=batch.status,
            model=batch.model,
            endpoint=batch.endpoint,
            total=batch.request_total,
            completed=batch.request_completed,
            failed=batch.request_failed,
            created_at=batch.created_at.isoformat(),
        )


@click.group()
def batches() -> None:
    """List, show and cancel Batch API batches (every tenant's)."""


@batches.command("list")
@click.option("--tenant", help="Only this tenant's (id or name).")
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--limit", type=click.IntRange(1, 100), default=50, show_default=True)
@json_option
@pass_context
def batches_list(
    cli: CliContext, tenant: str | None, status: str | None, limit: int, as_json: bool
) -> None:
    """The newest batches first."""

    async def work(s: AdminServices) -> list[BatchRow]:
        tenant_id = (await s.tenants.find(s.principal, tenant)).id if tenant else None
        rows, _ = await s.batches.page(s.principal, limit=limit, tenant_id=tenant_id, status=status)
        return [BatchRow.of(b) for b in rows]

    _emit(_run(cli, work), BATCH_COLUMNS, as_json)


@batches.command("show")
@click.argument("batch_id")
@pass_context
def batches_show(cli: CliContext, batch_id: str) -> None:
    """One batch as `GET /v1/batches/{id}` answers it, with its tenant and what its lines
    were charged so far (from the ledger), as JSON."""
    from hydrant.platform.batches.schemas import BatchObject
    from hydrant.platform.reports.schemas import money_text

    async def work(s: AdminServices) -> dict[str, Any]:
        batch = await s.batches.get(s.principal, batch_id)
        charged = (await s.batches.charged([batch]))[batch.id]
        view = msgspec.to_builtins(BatchObject.of(batch))
        return {**view, "tenant_id": batch.tenant_id, "charged": money_text(charged)}

    click.echo(msgspec.json.encode(_run(cli, work)).decode())


@batches.command("cancel")
@click.argument("batch_id")
@json_option
@pass_context
def batches_cancel(cli: CliContext, batch_id: str, as_json: bool) -> None:
    """Cancel a batch: no line starts any more, the ones running stop unbilled, and it
    ends `cancelled` with what was served."""

    async def work(s: AdminServices) -> BatchRow:
        return BatchRow.of(await s.batches.cancel(s.principal, batch_id))

    _emit([_run(cli, work)], BATCH_COLUMNS, as_json)
