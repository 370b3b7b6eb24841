"""`hydrant billing invoices list|show|finalize` through click against a SQLite data directory
with real ledger entries."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from click.testing import CliRunner, Result
from digest_factories import make_ledger, make_world, record
from invoice_factories import local
from pypdf import PdfReader

from hydrant.cli.main import cli
from hydrant.platform.db.session import Database
from hydrant.settings import load_settings


async def _usage(url: str, data_dir: Path) -> None:
    db = Database(url)
    try:
        world = await make_world(db, name="acme")
        ledger = make_ledger(db, data_dir)
        for day in (3, 27):
            await record(
                ledger, world, key="backend", model="qwen-tiny",
                finished_at=local(2026, 11, day, 8), tokens=(3000, 0, 700),
            )  # fmt: skip
    finally:
        await db.dispose()


def test_list_show_finalize(data_dir: Path, tmp_path: Path) -> None:
    env = {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}

    def run(*args: str) -> Result:
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == 0, (args, result.output)
        return result

    run("tenants", "list")  # migrates the data directory's database
    url = load_settings(env).effective_database_url
    asyncio.run(_usage(url, data_dir))

    draft = json.loads(
        run("billing", "invoices", "show", "acme", "2026-11", "--format", "json").stdout
    )
    assert draft["status"] == "draft" and draft["number"] is None
    finalized = run("billing", "invoices", "finalize", "--month", "2026-11")
    assert "created 1," in finalized.stdout and "tenants 1/1" in finalized.stderr
    again = json.loads(
        run("billing", "invoices", "finalize", "--month", "2026-11", "--json").stdout
    )
    assert again["created"] == [] and len(again["existing"]) == 1

    listing = json.loads(run("billing", "invoices", "list", "acme", "--json").stdout)
    assert [i["status"] for i in listing] == ["draft", "finalized"]
    invoice = listing[1]
    assert invoice["subtotal"] == draft["subtotal"] and invoice["number"] == "HYD-2026-000001"
    table = run("billing", "invoices", "show", "acme", invoice["id"]).stdout
    assert f"amount_due\t{invoice['amount_due']}" in table
    target = tmp_path / "invoice.pdf"
    run(
        "billing",
        "invoices",
        "show",
        "acme",
        invoice["id"],
        "--format",
        "pdf",
        "--output",
        str(target),
    )
    text = PdfReader(io.BytesIO(target.read_bytes())).pages[0].extract_text()
    assert "HYD-2026-000001" in text and invoice["amount_due"] in text
    refused = CliRunner().invoke(
        cli, ["billing", "invoices", "finalize", "--month", "26-1"], env=env
    )
    assert refused.exit_code != 0 and "is not a month" in refused.output
