"""`hydrant projects add|list|archive` and `hydrant keys create --project` through click
against a SQLite data directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from hydrant.cli.admin import keys, tenants
from hydrant.cli.context import CliContext
from hydrant.cli.projectcmd import projects


@click.group()
@click.pass_context
def root(ctx: click.Context) -> None:
    ctx.obj = CliContext(config_file=None)


for command in (tenants, keys, projects):
    root.add_command(command)


@pytest.fixture()
def run(data_dir: Path) -> Callable[..., Result]:
    env = {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}

    def invoke(*args: str, ok: bool = True) -> Result:
        result = CliRunner().invoke(root, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (args, result.output)
        return result

    return invoke


def test_add_list_key_in_project_archive(run: Callable[..., Result]) -> None:
    run("tenants", "create", "acme")
    made = json.loads(
        run(
            "projects",
            "add",
            "acme",
            "web",
            "--spend-per-day",
            "2.5",
            "--requests-per-minute",
            "60",
            "--json",
        ).stdout
    )[0]
    assert (made["name"], made["status"], made["spend_per_day"]) == ("web", "active", "2.500000")
    assert made["requests_per_minute"] == 60
    listing = run("projects", "list", "acme").stdout.splitlines()
    assert listing[0].split("\t")[:3] == ["id", "tenant_id", "name"]
    assert listing[1].split("\t")[2] == "web"
    duplicate = run("projects", "add", "acme", "web", ok=False)
    assert duplicate.exit_code != 0 and "already has a project named" in duplicate.output

    key = json.loads(
        run(
            "keys", "create", "--tenant", "acme", "--project", "web", "--spend-per-day", "1",
            "--json",
        ).stdout
    )  # fmt: skip
    assert key["key"]["project_id"] == made["id"]
    assert key["key"]["spend_per_day"] == "1.000000"

    assert "archived" in run("projects", "archive", "acme", "web").stdout
    assert run("projects", "list", "acme").stdout.splitlines()[1:] == []
    archived = run("projects", "list", "acme", "--archived", "--json").stdout
    assert json.loads(archived)[0]["status"] == "archived"
    refused = run("keys", "create", "--tenant", "acme", "--project", "web", ok=False)
    assert refused.exit_code != 0 and "archived" in refused.output


def test_keys_budgets_set_clear_and_refuse(run: Callable[..., Result]) -> None:
    run("tenants", "create", "acme")
    made = json.loads(
        run("keys", "create", "--tenant", "acme", "--tokens-per-month", "900", "--json").stdout
    )["key"]
    assert made["tokens_per_month"] == 900
    key_id = made["id"]
    changed = json.loads(
        run(
            "keys", "budgets", key_id, "--tokens-per-day", "50", "--spend-per-month", "12.5",
            "--clear", "tokens-per-month", "--json",
        ).stdout
    )[0]  # fmt: skip
    assert (changed["tokens_per_day"], changed["tokens_per_month"]) == (50, None)
    assert changed["spend_per_month"] == "12.500000"
    shown = run("keys", "budgets", key_id).stdout.splitlines()  # nothing named: shown
    assert shown[0].split("\t")[3:] == [
        "tokens_per_day",
        "tokens_per_month",
        "spend_per_day",
        "spend_per_month",
    ]
    assert shown[1].split("\t")[3:] == ["50", "-", "-", "12.500000"]

    bad_money = run("keys", "budgets", key_id, "--spend-per-day", "1.1234567", ok=False)
    assert bad_money.exit_code != 0 and "spend_per_day" in bad_money.output
    negative = run("keys", "budgets", key_id, "--spend-per-day", "-1", ok=False)
    assert negative.exit_code != 0 and "spend_per_day" in negative.output
    both = run(
        "keys", "budgets", key_id, "--tokens-per-day", "1", "--clear", "tokens-per-day", ok=False
    )
    assert both.exit_code == 2 and "contradict" in both.output
    run("keys", "revoke", key_id)
    revoked = run("keys", "budgets", key_id, "--tokens-per-day", "1", ok=False)
    assert revoked.exit_code != 0 and "revoked" in revoked.output
    missing = run("keys", "budgets", "key_nope", "--tokens-per-day", "1", ok=False)
    assert missing.exit_code != 0 and "key_nope" in missing.output
