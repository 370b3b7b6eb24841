"""The `hydrant` command: real help for every family, honest refusals, working migrate."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hydrant.cli.main import cli

COMMANDS = [
    "serve",
    "worker",
    "migrate",
    "tenants",
    "keys",
    "models",
    "report",
    "capacity",
    "demo-model",
    "jobs",
]


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.output, name


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_help(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and len(result.output.splitlines()) > 3


@pytest.mark.parametrize(
    ("args", "issue"),
    [
        (["worker"], "#6"),
        (["jobs", "beat"], "#7"),
    ],
)
def test_later_features_refuse_instead_of_pretending(args: list[str], issue: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert issue in result.output


def test_migrate_then_check(tmp_path: Path) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text"}
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate"], env=env)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hydrant.db").is_file()
    result = runner.invoke(cli, ["migrate", "check"], env=env)
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["migrate", "down", "base"], env=env)
    assert result.exit_code == 0, result.output


def test_bad_setting_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["migrate"], env={"HYDRANT_PORT": "x"})
    assert result.exit_code == 2
    assert "HYDRANT_PORT" in result.output


def test_capacity_works_the_fields_example() -> None:
    result = CliRunner().invoke(
        cli,
        [
            "capacity",
            "--model",
            "llama-3-8b",
            "--memory-gib",
            "80",
            "--prompt-tokens",
            "512",
            "--output-tokens",
            "1536",
            "--max-num-seqs",
            "256",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "KV blocks                28,693" in result.output
    assert "max_num_seqs=256 cannot all fit" in result.output


def test_capacity_rejects_unknown_shapes() -> None:
    result = CliRunner().invoke(cli, ["capacity", "--model", "gpt-9"])
    assert result.exit_code == 2
    assert "gpt-9" in result.output
