"""`hydrant models adapters add|list|remove` through click against a SQLite data directory."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from hydrant.cli.admin import tenants
from hydrant.cli.context import CliContext
from hydrant.cli.modelcmds import models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "adapters"))

from peft_dirs import write_adapter


@click.group()
@click.pass_context
def root(ctx: click.Context) -> None:
    ctx.obj = CliContext(config_file=None)


root.add_command(tenants)
root.add_command(models)


@pytest.fixture()
def run(data_dir: Path, demo_model_dir: Path) -> Callable[..., Result]:
    env = {
        "HYDRANT_DATA_DIR": str(data_dir),
        "HYDRANT_LOG_FORMAT": "text",
        "HYDRANT_MODELS": f"demo={demo_model_dir}",
    }

    def invoke(*args: str, ok: bool = True) -> Result:
        result = CliRunner().invoke(root, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (args, result.output)
        return result

    return invoke


def test_add_list_remove(run: Callable[..., Result], tmp_path: Path, demo_model_dir: Path) -> None:
    run("tenants", "create", "acme")
    path = str(write_adapter(tmp_path / "sql", demo_model_dir))
    added = json.loads(
        run(
            "models", "adapters", "add", "demo", "sql", path, "--tenant", "acme",
            "--input-price", "0.5", "--output-price", "1.5", "--hosting-fee-per-day", "2",
            "--json",
        ).stdout
    )[0]  # fmt: skip
    assert (added["model"], added["path"]) == ("demo:sql", path)
    assert added["hosting_fee_per_day"] == "2.000000"
    assert added["tenant_id"].startswith("ten_") and added["price_model_id"].startswith("mdl_")
    run(
        "models",
        "adapters",
        "add",
        "demo",
        "open",
        str(write_adapter(tmp_path / "o", demo_model_dir)),
    )
    table = run("models", "adapters", "list", "demo").stdout.splitlines()
    assert table[0].split("\t") == [
        "model", "tenant_id", "path", "hosting_fee_per_day", "price_model_id", "created_at"
    ]  # fmt: skip
    assert [line.split("\t")[:2] for line in table[1:]] == [
        ["demo:open", "-"],
        ["demo:sql", added["tenant_id"]],
    ]
    duplicate = run("models", "adapters", "add", "demo", "sql", path, ok=False)
    assert duplicate.exit_code == 1 and "has an adapter named 'sql'" in duplicate.output
    bad = run("models", "adapters", "add", "demo", "x", str(tmp_path), ok=False)
    assert bad.exit_code == 1 and "adapter_config.json is missing" in bad.output
    half = run("models", "adapters", "add", "demo", "y", path, "--input-price", "1", ok=False)
    assert half.exit_code == 2 and "go together" in half.output

    assert run("models", "adapters", "remove", "demo", "sql").stdout == "removed demo:sql\n"
    listed = json.loads(run("models", "adapters", "list", "demo", "--json").stdout)
    assert [a["model"] for a in listed] == ["demo:open"]
    gone = run("models", "adapters", "remove", "demo", "sql", ok=False)
    assert gone.exit_code == 1 and "has no adapter 'sql'" in gone.output
