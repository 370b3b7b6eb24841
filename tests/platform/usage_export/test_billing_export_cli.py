"""`hydrant billing export` as a user runs it, through click against PostgreSQL: the CSV and
the JSON lines hold the ledger's per-hour sums exactly, a tenant filter keeps to the
tenant, progress goes to stderr; and `hydrant billing customer` sets the Stripe customer."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from export_factories import Sums, ledger_sums, seed_ledger
from report_factories import BASE, Row

from hydrant.cli.main import cli
from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.session import Database
from hydrant.platform.reports.repository import bucket_value
from hydrant.platform.usage_export.service import BillingCustomerService

pytestmark = pytest.mark.integration


def _seed(url: str, **kwargs: object) -> tuple[dict[str, str], list[Row]]:
    """The CLI runs its own event loop, so these tests are plain functions that seed first."""

    async def seed() -> tuple[dict[str, str], list[Row]]:
        database = Database(url)
        try:
            return await seed_ledger(database, **kwargs)  # type: ignore[arg-type]
        finally:
            await database.dispose()

    return asyncio.run(seed())


def _sums(rows: list[dict[str, str]]) -> Sums:
    return {
        (r["tenant_id"], r["model"], bucket_value(r["hour"])): (
            int(r["requests"]),
            int(r["input_tokens"]),
            int(r["cached_tokens"]),
            int(r["output_tokens"]),
            Decimal(r["charged"]),
        )
        for r in rows
    }


def test_csv_and_jsonl_agree_with_the_ledger(pg_url: str, tmp_path: Path) -> None:
    tenants, rows = _seed(pg_url, count=300, hours=60, seed=9, tenants=("acme", "beta"))
    runner = CliRunner()
    env = {"HYDRANT_DATABASE_URL": pg_url, "HYDRANT_DATA_DIR": str(tmp_path)}
    since, until = BASE.isoformat(), (BASE + timedelta(hours=50)).isoformat()
    expected = ledger_sums(rows, BASE + timedelta(hours=50))

    out = tmp_path / "usage.csv"
    done = runner.invoke(
        cli, ["billing", "export", "--since", since, "--until", until, "-o", str(out)], env=env
    )
    assert done.exit_code == 0, done.output
    table = list(csv.DictReader(io.StringIO(out.read_text())))
    assert _sums(table) == expected
    assert "billing export: 2026-03-02 00:00 to 2026-03-03 00:00" in done.stderr
    assert f"{len(table)} rows written" in done.stderr

    lines = runner.invoke(
        cli,
        ["billing", "export", "--since", since, "--until", until, "--format", "jsonl",
         "--tenant", "beta"],
        env=env,
    )  # fmt: skip
    assert lines.exit_code == 0, lines.output
    parsed = [json.loads(line) for line in lines.stdout.splitlines()]
    assert all(isinstance(p["charged"], str) for p in parsed)
    beta = {k: v for k, v in expected.items() if k[0] == tenants["beta"]}
    assert _sums(parsed) == beta and beta

    bad = runner.invoke(cli, ["billing", "export", "--since", "yesterday"], env=env)
    assert bad.exit_code == 2 and "--since" in bad.stderr


def test_the_stripe_customer_is_set_shown_and_cleared(pg_url: str, tmp_path: Path) -> None:
    tenants, _ = _seed(pg_url, count=1, hours=1, seed=1)
    runner = CliRunner()
    env = {"HYDRANT_DATABASE_URL": pg_url, "HYDRANT_DATA_DIR": str(tmp_path)}
    done = runner.invoke(cli, ["billing", "customer", "acme", "cus_Acme123"], env=env)
    assert (done.exit_code, done.stdout.strip()) == (0, "cus_Acme123")

    async def stored() -> str | None:
        database = Database(pg_url)
        try:
            async with database.session() as session:
                return await BillingCustomerService(session).get(CONSOLE, tenants["acme"])
        finally:
            await database.dispose()

    assert asyncio.run(stored()) == "cus_Acme123"
    refused = runner.invoke(cli, ["billing", "customer", "acme", "not-a-customer"], env=env)
    assert refused.exit_code == 1 and "cus_" in refused.stderr
    cleared = runner.invoke(cli, ["billing", "customer", "acme", "--clear"], env=env)
    assert cleared.stdout.strip() == "(none)"
    missing = runner.invoke(cli, ["billing", "customer", "nobody"], env=env)
    assert missing.exit_code == 1 and "no tenant" in missing.stderr
