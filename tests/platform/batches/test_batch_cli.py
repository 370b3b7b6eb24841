"""`hydrant batches list|show|cancel` through click on a SQLite data directory: every
tenant's batches, one with what its lines were charged (from the ledger), a cancel."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import click
from click.testing import CliRunner

from hydrant.cli.batchcmd import batches
from hydrant.cli.context import CliContext
from hydrant.platform.db import migrate
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Batch, LedgerEntry, ModelDeployment, Tenant
from hydrant.platform.db.session import Database
from hydrant.settings import load_settings


@click.group()
@click.pass_context
def root(ctx: click.Context) -> None:
    ctx.obj = CliContext(config_file=None)


root.add_command(batches)


def _seed(url: str) -> None:
    async def write() -> None:
        database = Database(url)
        now = utcnow()
        try:
            async with database.session() as session:
                session.add_all([Tenant(id="ten_a", name="acme"), Tenant(id="ten_b", name="beta")])
                session.add(ModelDeployment(id="mdl_d", name="demo", path="/m"))
                await session.flush()
                for n, (tenant, status) in enumerate(
                    [("ten_a", "completed"), ("ten_a", "in_progress"), ("ten_b", "in_progress")]
                ):
                    session.add(
                        Batch(
                            id=f"batch_{n}",
                            tenant_id=tenant,
                            endpoint="/v1/chat/completions",
                            model="demo",
                            input_file_id="file-x",
                            status=status,
                            request_total=3,
                            request_completed=2,
                            created_at=now + timedelta(seconds=n),
                            expires_at=now + timedelta(hours=24),
                        )
                    )
                await session.flush()
                for n, charged in enumerate(["0.000150", "0.000075"]):
                    session.add(
                        LedgerEntry(
                            request_id=f"batch_req_0_{n}",
                            tenant_id="ten_a",
                            model_id="mdl_d",
                            status="finished",
                            charged=Decimal(charged),
                            started_at=now,
                            finished_at=now,
                            batch_id="batch_0",
                        )
                    )
        finally:
            await database.dispose()

    asyncio.run(write())


def test_the_console_lists_shows_and_cancels_every_tenants_batches(data_dir: Path) -> None:
    url = load_settings({}, data_dir=data_dir).effective_database_url
    migrate.upgrade(url)
    _seed(url)
    env = {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}

    def run(*args: str) -> str:
        result = CliRunner().invoke(root, list(args), env=env)
        assert result.exit_code == 0, (args, result.output)
        return result.stdout

    listed = json.loads(run("batches", "list", "--json"))
    assert [b["id"] for b in listed] == ["batch_2", "batch_1", "batch_0"]  # newest first
    acme = json.loads(
        run("batches", "list", "--tenant", "acme", "--status", "in_progress", "--json")
    )
    assert [b["id"] for b in acme] == ["batch_1"]
    table = run("batches", "list").splitlines()
    assert table[0].split("\t")[:3] == ["id", "tenant_id", "status"] and len(table) == 4
    shown = json.loads(run("batches", "show", "batch_0"))
    assert shown["object"] == "batch" and shown["tenant_id"] == "ten_a"
    assert shown["charged"] == "0.000225"
    assert shown["request_counts"] == {"total": 3, "completed": 2, "failed": 0}
    cancelled = json.loads(run("batches", "cancel", "batch_2", "--json"))
    assert cancelled[0]["status"] == "cancelling"
    done = CliRunner().invoke(root, ["batches", "cancel", "batch_0"], env=env)
    assert done.exit_code != 0 and "completed" in done.output
    missing = CliRunner().invoke(root, ["batches", "show", "batch_nope"], env=env)
    assert missing.exit_code != 0 and "batch_nope" in missing.output
