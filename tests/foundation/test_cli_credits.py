"""`hydrant credits grant|void|list|alerts` through click against a SQLite data directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from hydrant.cli.admin import tenants
from hydrant.cli.context import CliContext
from hydrant.cli.creditcmd import credits_group


@click.group()
@click.pass_context
def root(ctx: click.Context) -> None:
    ctx.obj = CliContext(config_file=None)


root.add_command(tenants)
root.add_command(credits_group)


@pytest.fixture()
def run(data_dir: Path) -> Callable[..., Result]:
    env = {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}

    def invoke(*args: str, ok: bool = True) -> Result:
        result = CliRunner().invoke(root, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (args, result.output)
        return result

    return invoke


def test_grant_list_void(run: Callable[..., Result]) -> None:
    run("tenants", "create", "acme")
    promo = json.loads(
        run(
            "credits", "grant", "acme", "2.50", "--kind", "promo", "--expires", "2099-01-31",
            "--note", "welcome", "--json",
        ).stdout
    )[0]  # fmt: skip
    assert (promo["kind"], promo["amount"], promo["remaining"]) == ("promo", "2.500000", "2.500000")
    assert promo["expires_at"].startswith("2099-01-31")
    run("credits", "grant", "acme", "10")
    listing = run("credits", "list", "acme").stdout.splitlines()
    assert listing[0].split("\t")[:3] == ["id", "kind", "amount"]
    assert listing[-1] == "available\t12.500000\tUSD"

    run("credits", "void", "acme", promo["id"])
    balance = json.loads(run("credits", "list", "acme", "--json").stdout)
    assert balance["available"] == "10.000000"
    voided = next(g for g in balance["grants"] if g["id"] == promo["id"])
    assert voided["voided_at"] is not None and voided["remaining"] == "0.000000"


def test_bad_input_is_a_clear_error(run: Callable[..., Result]) -> None:
    run("tenants", "create", "acme")
    for args in (
        ("credits", "grant", "acme", "1.5e3"),
        ("credits", "grant", "acme", "-1"),
        ("credits", "grant", "nobody", "1"),
        ("credits", "void", "acme", "cg_missing"),
    ):
        result = run(*args, ok=False)
        assert result.exit_code != 0, args
        assert "Traceback" not in result.output, (args, result.output)


def test_low_balance_thresholds(run: Callable[..., Result]) -> None:
    run("tenants", "create", "acme")
    assert run("credits", "alerts", "acme").stdout.splitlines() == ["amount\tbelow\tcrossings"]
    run("credits", "alerts", "acme", "--set", "5", "--set", "20.5")
    shown = json.loads(run("credits", "alerts", "acme", "--json").stdout)
    assert [t["amount"] for t in shown["thresholds"]] == ["20.500000", "5.000000"]
    assert shown["currency"] == "USD"
    for bad in (("--set", "-3"), ("--set", "x"), ("--set", "1", "--clear")):
        result = run("credits", "alerts", "acme", *bad, ok=False)
        assert result.exit_code != 0 and "Traceback" not in result.output, (bad, result.output)
    run("credits", "alerts", "acme", "--clear")
    assert json.loads(run("credits", "alerts", "acme", "--json").stdout)["thresholds"] == []
