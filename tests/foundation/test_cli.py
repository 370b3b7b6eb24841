"""The `hydrant` command: real help for every family, honest refusals, working migrate."""

from __future__ import annotations

import json
import shutil
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
    ("args", "env", "needle"),
    [
        (["worker"], {}, "--model"),
        (["worker", "--model", "demo"], {"HYDRANT_REDIS_URL": ""}, "HYDRANT_REDIS_URL"),
        (
            ["worker", "--model", "demo"],
            {"HYDRANT_REDIS_URL": "redis://127.0.0.1:1/0", "HYDRANT_WORKER_SECRET": ""},
            "HYDRANT_WORKER_SECRET",
        ),
    ],
)
def test_worker_without_its_settings_is_a_usage_error(
    args: list[str], env: dict[str, str], needle: str, tmp_path: Path
) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text", **env}
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    assert needle in result.output


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_jobs_without_redis_refuse_clearly(command: str, tmp_path: Path) -> None:
    """Worker and beat need a broker; the refusal names the setting and the embedded path."""
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text"}
    result = CliRunner().invoke(cli, ["jobs", command], env=env)
    assert result.exit_code == 2, result.output
    assert "HYDRANT_REDIS_URL" in result.output and "hydrant serve" in result.output


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
    # 8 LoRA slots of rank 16 (the engine's defaults) keep 0.94 GiB out of the KV cache
    assert "LoRA slots               0.94 GiB" in result.output
    assert "KV blocks                28,213" in result.output
    assert "max_num_seqs=256 cannot all fit" in result.output


def test_capacity_rejects_unknown_shapes() -> None:
    result = CliRunner().invoke(cli, ["capacity", "--model", "gpt-9"])
    assert result.exit_code == 2
    assert "gpt-9" in result.output


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"HYDRANT_ADMIN_BOOTSTRAP_KEY": "hyd_test_typo"}, "HYDRANT_ADMIN_BOOTSTRAP_KEY"),
        ({"HYDRANT_KEY_CACHE_TTL_S": "0"}, "HYDRANT_KEY_CACHE_TTL_S"),
    ],
)
def test_serve_refuses_bad_auth_settings_in_one_line_before_loading_a_model(
    env: dict[str, str], needle: str, tmp_path: Path
) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text", **env}
    result = CliRunner().invoke(cli, ["serve"], env=env)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: ") and needle in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "models").exists()  # refused before the demo model was written


def test_a_setting_refused_while_a_part_is_built_is_a_usage_error(tmp_path: Path) -> None:
    """Not every refusal comes from reading the settings: worker pools check what they need
    when they are built, and that still ends as one line with exit code 2."""
    env = {
        "HYDRANT_DATA_DIR": str(tmp_path),
        "HYDRANT_LOG_FORMAT": "text",
        "HYDRANT_WORKER_POOLS": "true",
        "HYDRANT_REDIS_URL": "",
    }
    result = CliRunner().invoke(cli, ["serve"], env=env)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: worker pools need Redis"), result.output
    assert "Traceback" not in result.output


def test_serve_with_a_directory_that_is_no_checkpoint_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {"HYDRANT_DATA_DIR": str(tmp_path / "data"), "HYDRANT_LOG_FORMAT": "text"}
    result = CliRunner().invoke(cli, ["serve", "--model", f"mine={tmp_path / 'empty'}"], env=env)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "config.json" in last and str(tmp_path) in last
    assert "Traceback" not in result.output


def test_serve_refuses_a_tool_call_parser_for_a_model_it_does_not_serve(tmp_path: Path) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text"}
    result = CliRunner().invoke(cli, ["serve", "--tool-call-parser", "qwen=hermes"], env=env)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "qwen, which is not served" in last
    assert "Traceback" not in result.output
    assert not (tmp_path / "models").exists()  # refused before the demo model was written


def test_models_list_says_what_serves_each_model(tmp_path: Path) -> None:
    """A model of HYDRANT_POOL_BACKENDS needs only its tokenizer here (the upstream server
    holds the weights); the last column names its servers, `hydrant` for the others."""
    from hydrant.engine.demo_model import write_demo_model

    demo = write_demo_model(tmp_path / "demo")
    tokenizer_only = tmp_path / "big"
    tokenizer_only.mkdir()
    (tokenizer_only / "tokenizer.json").write_bytes((demo / "tokenizer.json").read_bytes())
    env = {
        "HYDRANT_DATA_DIR": str(tmp_path / "data"),
        "HYDRANT_LOG_FORMAT": "text",
        "HYDRANT_MODELS": f"demo={demo},big={tokenizer_only}",
        "HYDRANT_POOL_BACKENDS": "big=openai:http://vllm-a:8000,http://vllm-b:8000",
    }
    result = CliRunner().invoke(cli, ["models", "list"], env=env)
    assert result.exit_code == 0, result.output
    rows = {line.split("\t")[0]: line.split("\t") for line in result.output.splitlines()}
    assert rows["demo"][3:] == ["ok", "hydrant"]
    assert rows["big"][3:] == ["ok", "openai:http://vllm-a:8000,http://vllm-b:8000"]
    env["HYDRANT_UPSTREAM_SLEEP"] = "big"
    sleepy = CliRunner().invoke(cli, ["models", "list"], env=env)
    assert sleepy.exit_code == 0, sleepy.output
    assert sleepy.output.splitlines()[-1].endswith("http://vllm-b:8000 (sleeps when idle)")


def test_models_list_names_a_hub_checkpoints_quantization(tmp_path: Path) -> None:
    """An AWQ/GPTQ/compressed-tensors checkpoint shows its format after the architecture;
    a variant the engine refuses is not servable, with the field named."""
    from hydrant.engine.demo_model import write_demo_model

    demo = write_demo_model(tmp_path / "demo")
    models = {}
    for name, section in {
        "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
        "actorder": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True},
    }.items():
        path = tmp_path / name
        shutil.copytree(demo, path)
        config = json.loads((path / "config.json").read_text("utf-8"))
        config["quantization_config"] = section
        (path / "config.json").write_text(json.dumps(config), "utf-8")
        models[name] = path
    env = {
        "HYDRANT_DATA_DIR": str(tmp_path / "data"),
        "HYDRANT_LOG_FORMAT": "text",
        "HYDRANT_MODELS": ",".join(f"{name}={path}" for name, path in models.items()),
    }
    result = CliRunner().invoke(cli, ["models", "list"], env=env)
    assert result.exit_code == 0, result.output
    rows = {line.split("\t")[0]: line.split("\t") for line in result.output.splitlines()}
    assert rows["gptq"][2].endswith("(gptq int4 g128)")
    assert rows["gptq"][3] == "ok"
    assert rows["actorder"][3].startswith("NOT SERVABLE")
    assert "desc_act = True" in rows["actorder"][3]
