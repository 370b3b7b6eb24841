"""`hydrant report`: the admin cost report at the console, on a migrated SQLite database."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hydrant.cli.context import CliContext
from hydrant.cli.reportcmd import report
from hydrant.platform.db import migrate
from hydrant.platform.db.session import Database

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "reports"))

from report_factories import add_models, add_tenants, insert_rows, row

DAY = datetime(2026, 3, 5, tzinfo=UTC)


def env_for(data_dir: Path) -> dict[str, str]:
    return {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}


def invoke(data_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(
        report, list(args), obj=CliContext(config_file=None), env=env_for(data_dir)
    )


@pytest.fixture()
def ledger(data_dir: Path) -> dict[str, str]:
    """A migrated database with two tenants' entries on two days; returns the tenant ids."""
    url = f"sqlite+aiosqlite:///{data_dir / 'hydrant.db'}"
    migrate.upgrade(url)

    async def seed() -> dict[str, str]:
        database = Database(url)
        try:
            async with database.session() as session:
                tenants = await add_tenants(session, ["acme", "globex"])
                models = await add_models(session, ["alpha", "beta"])
                acme, globex = tenants["acme"], tenants["globex"]
                entries = [
                    row(acme, "alpha", DAY + timedelta(hours=1), "0.333333", request_id="r1",
                        device_cost="0.1"),
                    row(acme, "alpha", DAY + timedelta(hours=9), "0.333334", request_id="r2"),
                    row(globex, "beta", DAY + timedelta(days=1, hours=2), "2.005", request_id="r3",
                        device_cost="1"),
                ]  # fmt: skip
                await insert_rows(session, entries, models)
            return tenants
        finally:
            await database.dispose()

    return asyncio.run(seed())


def test_json_report_has_exact_rows_and_rounded_totals(
    data_dir: Path, ledger: dict[str, str]
) -> None:
    result = invoke(data_dir, "--since", "2026-03-05", "--until", "2026-03-06", "--format", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [(r["bucket"], r["tenant_id"], r["charged"]) for r in body["data"]] == [
        ("2026-03-05T00:00:00Z", ledger["acme"], "0.666667"),
        ("2026-03-06T00:00:00Z", ledger["globex"], "2.005000"),
    ]
    assert body["totals"]["charged"] == "2.671667"
    assert body["totals"]["rounded"] == {
        "charged": "2.67",
        "device_cost": "1.10",
        "margin": "1.57",
        "batch_charged": "0.00",
    }


def test_table_report_by_hour_for_one_tenant_by_name(
    data_dir: Path, ledger: dict[str, str]
) -> None:
    result = invoke(data_dir, "--since", "2026-03-05", "--until", "2026-03-05", "--tenant", "acme",
                    "--by", "hour")  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("costs from 2026-03-05T00:00:00Z to 2026-03-06T00:00:00Z")
    assert lines[1].split()[:3] == ["bucket", "tenant", "model"]
    assert lines[2].split()[:4] == ["2026-03-05", "01:00", ledger["acme"], "alpha"]
    assert lines[3].split()[:2] == ["2026-03-05", "09:00"]
    assert lines[4].split()[0] == "total" and "0.666667" in lines[4]
    assert ledger["globex"] not in result.output
    assert lines[-1] == (
        "total charged 0.67 (batch 0.00), device cost 0.10, margin 0.57 (rounded to cents)"
    )


def test_csv_report_matches_the_json_report(data_dir: Path, ledger: dict[str, str]) -> None:
    period = ["--since", "2026-03-01", "--until", "2026-03-10", "--model", "beta"]
    as_csv = invoke(data_dir, *period, "--format", "csv")
    as_json = invoke(data_dir, *period, "--format", "json")
    assert as_csv.exit_code == 0 and as_json.exit_code == 0, as_csv.output
    records = list(csv.DictReader(io.StringIO(as_csv.output)))
    rows = json.loads(as_json.output)["data"]
    # `group` is a CSV column only in a report by an attribution (null in every row here).
    assert {r["group"] for r in rows} == {None}
    expected = [{k: str(v) for k, v in r.items() if k != "group"} for r in rows]
    assert records == expected and len(records) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "soon"], "--since"),
        (["--since", "2026-03-06", "--until", "2026-03-01"], "--since"),
        (["--by", "week"], "week"),
        (["--since", "2026-01-01", "--until", "2026-06-01", "--by", "hour"], "at most 62 days"),
    ],
)
def test_bad_options_are_usage_errors(
    data_dir: Path, ledger: dict[str, str], args: list[str], message: str
) -> None:
    result = invoke(data_dir, *args)
    assert result.exit_code == 2
    assert message in result.output


def test_unknown_tenant_is_an_error(data_dir: Path, ledger: dict[str, str]) -> None:
    result = invoke(data_dir, "--tenant", "initech")
    assert result.exit_code == 1
    assert "no tenant 'initech'" in result.output


def test_an_unmigrated_database_says_what_to_do(data_dir: Path) -> None:
    result = invoke(data_dir)
    assert result.exit_code == 1
    assert "hydrant migrate" in result.output


def test_table_marks_an_upstream_models_device_cost_as_an_estimate(
    data_dir: Path, ledger: dict[str, str]
) -> None:
    env = {
        **env_for(data_dir),
        "HYDRANT_MODELS": f"beta={data_dir / 'beta-tokenizer'}",
        "HYDRANT_POOL_BACKENDS": "beta=openai:http://vllm-beta:8000",
    }
    args = ["--since", "2026-03-05", "--until", "2026-03-06"]
    result = CliRunner().invoke(report, args, obj=CliContext(config_file=None), env=env)
    assert result.exit_code == 0, result.output
    rows = {line.split()[2]: line.split() for line in result.output.splitlines()[2:4]}
    assert "~1.000000" in rows["beta"] and not any(c.startswith("~") for c in rows["alpha"])
    assert result.output.splitlines()[-1].startswith("~ device cost estimated")
