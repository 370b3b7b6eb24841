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
