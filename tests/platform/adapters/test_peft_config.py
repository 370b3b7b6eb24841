"""Registration's check of an adapter directory: every problem found, none for a good one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from peft_dirs import write_adapter

from hydrant.platform.adapters.peft_config import inspect_adapter


def test_a_peft_adapter_of_the_base_model_passes(tmp_path: Path, demo_model_dir: Path) -> None:
    path = write_adapter(tmp_path / "a", demo_model_dir, r=8, targets=("q_proj", "down_proj"))
    info = inspect_adapter(path, demo_model_dir)
    assert info.problems == ()
    assert (info.rank, info.target_modules) == (8, ("q_proj", "down_proj"))


def test_an_adapter_of_another_base_model_is_refused(tmp_path: Path, demo_model_dir: Path) -> None:
    other = tmp_path / "other-base"
    other.mkdir()
    config = json.loads((demo_model_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    path = write_adapter(tmp_path / "a", other, targets=("q_proj",))
    problems = inspect_adapter(path, demo_model_dir).problems
    assert problems and all("another base model" in p for p in problems)
    assert "reads 64 features, the base model's hidden_size is 128" in problems[0]
    # Without the base checkpoint at hand (an API node), the shape check is skipped.
    assert inspect_adapter(path, tmp_path / "nowhere").problems == ()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"r": 0}, "r must be an integer from 1 to 256, not 0"),
        ({"r": "8"}, "r must be an integer"),
        ({"target_modules": []}, "target_modules must be a non-empty list"),
        ({"target_modules": ["q_proj", "lm_head"]}, "target_modules ['lm_head'] are not served"),
        ({"peft_type": "IA3"}, "only LORA adapters are served"),
        ({"lora_alpha": -1}, "lora_alpha must be a positive number"),
        ({"r": 8}, "has rank 4, the config says r=8"),
    ],
)
def test_implausible_configs_say_why(
    tmp_path: Path, demo_model_dir: Path, overrides: dict, expected: str
) -> None:
    path = write_adapter(tmp_path / "a", demo_model_dir, r=4, config_overrides=overrides)
    problems = inspect_adapter(path, demo_model_dir).problems
    assert any(expected in p for p in problems), problems


def test_missing_and_broken_files(tmp_path: Path, demo_model_dir: Path) -> None:
    assert inspect_adapter(tmp_path / "none", None).problems == (
        f"{tmp_path / 'none'} is not a directory",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert inspect_adapter(empty, None).problems == ("adapter_config.json is missing",)
    path = write_adapter(tmp_path / "a", demo_model_dir)
    (path / "adapter_model.safetensors").write_bytes(b"\x05")
    assert "cannot be read: too short" in inspect_adapter(path, None).problems[0]
    (path / "adapter_model.safetensors").unlink()
    assert inspect_adapter(path, None).problems == ("adapter_model.safetensors is missing",)
    (path / "adapter_config.json").write_text("[1]")
    assert inspect_adapter(path, None).problems == ("adapter_config.json is not a JSON object",)
