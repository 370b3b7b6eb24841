"""The engine's torch thread count: how `auto` and an explicit value resolve, and that
building an engine applies it (and reports it) while None leaves the process alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model
from transformers import AutoModelForCausalLM

from hydrant.engine import engine_config
from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import (
    FRONT_PARAMS_PER_CORE_PAIR,
    EngineConfig,
    EngineConfigError,
    parse_num_threads,
    resolve_num_threads,
    usable_cpu_count,
)
from hydrant.engine.llm_engine import LLMEngine
from hydrant.errors import ConfigurationError
from hydrant.settings import load_settings

PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_auto_leaves_one_core_to_the_rest_of_the_process() -> None:
    assert resolve_num_threads("auto", 2, {}) == 1
    assert resolve_num_threads("auto", 16, {}) == 15
    assert resolve_num_threads("auto", 1, {}) == 1
    assert resolve_num_threads("auto", None, {}) == 1  # count unknown: the safe choice


def test_auto_gives_every_core_to_a_model_large_against_the_front() -> None:
    per_pair = FRONT_PARAMS_PER_CORE_PAIR
    # 2 cores: N (N - 1) = 2 pairs; the ~100M bench model (75M linear weights) takes both
    assert resolve_num_threads("auto", 2, {}, 75_497_472) == 2
    assert resolve_num_threads("auto", 2, {}, 2 * per_pair) == 2
    assert resolve_num_threads("auto", 2, {}, 2 * per_pair - 1) == 1
    assert resolve_num_threads("auto", 2, {}, 737_280) == 1  # the demo model
    # 16 cores: 240 pairs, so a 1B-weight model still leaves the front its core
    assert resolve_num_threads("auto", 16, {}, 1_000_000_000) == 15
    assert resolve_num_threads("auto", 16, {}, 240 * per_pair) == 16
    assert resolve_num_threads("auto", 1, {}, 10**10) == 1
    assert resolve_num_threads("auto", None, {}, 10**10) == 1  # count unknown: one core
    # an explicit count, the environment's or the setting's, still wins
    assert resolve_num_threads("auto", 2, {"OMP_NUM_THREADS": "1"}, 10**10) == 1
    assert resolve_num_threads(1, 2, {}, 10**10) == 1


def test_a_models_linear_weights_are_its_projections(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "llama", "gqa")
    config = ModelConfig.from_pretrained(model_dir)
    from_weights = sum(
        module.weight.numel()
        for name, module in AutoModelForCausalLM.from_pretrained(model_dir).named_modules()
        if name.rsplit(".", 1)[-1] in PROJECTIONS
    )
    assert config.linear_params == from_weights


def test_auto_respects_an_explicit_omp_num_threads() -> None:
    assert resolve_num_threads("auto", 16, {"OMP_NUM_THREADS": "4"}) == 4
    assert resolve_num_threads("auto", 2, {"OMP_NUM_THREADS": "2"}) == 2
    # not a usable count: ignored, as torch itself would
    assert resolve_num_threads("auto", 16, {"OMP_NUM_THREADS": "0"}) == 15
    assert resolve_num_threads("auto", 16, {"OMP_NUM_THREADS": "lots"}) == 15


def test_an_integer_wins_over_everything() -> None:
    assert resolve_num_threads(3, 2, {"OMP_NUM_THREADS": "8"}) == 3


def test_parse_accepts_auto_and_positive_integers_only() -> None:
    assert parse_num_threads("auto") == "auto"
    assert parse_num_threads(" AUTO ") == "auto"
    assert parse_num_threads("4") == 4
    assert parse_num_threads(2) == 2
    for bad in ("0", "-1", "two", "", 0):
        with pytest.raises(EngineConfigError):
            parse_num_threads(bad)
    with pytest.raises(EngineConfigError):
        EngineConfig(num_threads=0)


def test_the_setting_is_read_from_the_environment_and_checked() -> None:
    assert load_settings({}).engine_threads == "auto"
    assert load_settings({"HYDRANT_ENGINE_THREADS": "3"}).engine_threads == "3"
    with pytest.raises(ConfigurationError, match="HYDRANT_ENGINE_THREADS"):
        load_settings({"HYDRANT_ENGINE_THREADS": "0"})


@pytest.fixture()
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("restore_threads")
def test_building_an_engine_applies_and_reports_the_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tiny_llama_dir = build_tiny_model(tmp_path / "llama", "gqa")
    torch.set_num_threads(1)
    config = EngineConfig(num_gpu_blocks=16, show_progress=False)  # None: leave it
    assert LLMEngine.from_pretrained(tiny_llama_dir, config).load_report.threads == 1  # type: ignore[union-attr]
    with caplog.at_level(logging.INFO, logger="hydrant.engine.llm_engine"):
        engine = LLMEngine.from_pretrained(
            tiny_llama_dir, EngineConfig(num_gpu_blocks=16, show_progress=False, num_threads=2)
        )
    assert torch.get_num_threads() == 2
    # The async front steps on a thread of its own, started after the build: it runs with it.
    seen: list[int] = []
    stepper = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    stepper.start()
    stepper.join()
    assert seen == [2]
    assert engine.load_report is not None and engine.load_report.threads == 2
    record = next(r for r in caplog.records if "model load" in r.getMessage())
    assert "2 torch threads" in record.getMessage()
    assert record.torch_threads == 2  # type: ignore[attr-defined]


@pytest.mark.usefixtures("restore_threads")
def test_auto_sizes_the_count_by_the_model_being_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reads the model's size before it sets the count: the same tiny model is
    "large" against a front that costs one weight per core pair, and small against one that
    costs more than the model has."""
    tiny_llama_dir = build_tiny_model(tmp_path / "llama", "gqa")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = usable_cpu_count() or 1
    config = EngineConfig(num_gpu_blocks=16, show_progress=False, num_threads="auto")
    monkeypatch.setattr(engine_config, "FRONT_PARAMS_PER_CORE_PAIR", 1)
    assert LLMEngine.from_pretrained(tiny_llama_dir, config).load_report.threads == cores  # type: ignore[union-attr]
    monkeypatch.setattr(engine_config, "FRONT_PARAMS_PER_CORE_PAIR", 10**12)
    kept = max(1, cores - 1)
    assert LLMEngine.from_pretrained(tiny_llama_dir, config).load_report.threads == kept  # type: ignore[union-attr]
