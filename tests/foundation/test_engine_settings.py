"""Engine limits set for the gateway reach the in-process engine it builds (and the
per-model settings its served model carries)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hydrant.errors import ConfigurationError
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings


def test_long_lane_budget_and_max_num_seqs_reach_the_embedded_engine(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = load_settings(
        {
            "HYDRANT_LONG_LANE_TOKENS": "128",
            "HYDRANT_MAX_NUM_SEQS": "7",
            "HYDRANT_MAX_BACKGROUND_STEP_TOKENS": "24",
            "HYDRANT_TOOL_CALL_PARSERS": "demo=hermes",
        },
        data_dir=tmp_path,
        models=(ModelSpec(name="demo", path=demo_model_dir),),
        kv_cache_bytes=8 * 1024 * 1024,
    )
    loaded = load_embedded_engines(settings)
    try:
        config = loaded.engines[0].engine.config  # type: ignore[attr-defined]
        assert config.long_lane_tokens == 128
        assert config.max_num_seqs == 7
        assert config.max_background_step_tokens == 24
        assert loaded.registry.get("demo").max_num_seqs == 7
        assert loaded.registry.get("demo").tool_call_parser == "hermes"
    finally:
        asyncio.run(loaded.shutdown())


def test_max_num_seqs_unset_is_chosen_by_device(demo_model_dir: Path, tmp_path: Path) -> None:
    """0 (the default) means by device: 128 on a CPU, where each running sequence slows
    every decode step, 256 on a GPU; an explicit number is taken as it is (above)."""
    from hydrant.engine.engine_config import default_max_num_seqs

    assert load_settings({}).max_num_seqs == 0
    assert [default_max_num_seqs(d) for d in ("cpu", "cuda", "cuda:1")] == [128, 256, 256]
    settings = load_settings(
        {},
        data_dir=tmp_path,
        models=(ModelSpec(name="demo", path=demo_model_dir),),
        kv_cache_bytes=8 * 1024 * 1024,
    )
    loaded = load_embedded_engines(settings)
    try:
        assert loaded.engines[0].engine.config.max_num_seqs == 128  # type: ignore[attr-defined]
        assert loaded.registry.get("demo").max_num_seqs == 128
    finally:
        asyncio.run(loaded.shutdown())


def test_background_step_tokens_unset_are_chosen_by_device(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    """Unset means by device: 64 on a CPU, where a step of a few hundred tokens is several
    decode steps long, 512 on a GPU, where 64 would starve a batch's prefill; 0 is no cap;
    an empty variable is unset, and a word is a clear error."""
    from hydrant.engine.engine_config import default_background_step_tokens

    assert load_settings({}).max_background_step_tokens is None
    variable = "HYDRANT_MAX_BACKGROUND_STEP_TOKENS"
    assert load_settings({variable: ""}).max_background_step_tokens is None
    assert load_settings({variable: "0"}).max_background_step_tokens == 0
    with pytest.raises(ConfigurationError, match="MAX_BACKGROUND_STEP_TOKENS"):
        load_settings({"HYDRANT_MAX_BACKGROUND_STEP_TOKENS": "lots"})
    by_device = [default_background_step_tokens(None, d) for d in ("cpu", "cuda", "cuda:1")]
    assert by_device == [64, 512, 512]
    assert default_background_step_tokens(0, "cuda") is None
    assert default_background_step_tokens(24, "cuda") == 24
    settings = load_settings(
        {},
        data_dir=tmp_path,
        models=(ModelSpec(name="demo", path=demo_model_dir),),
        kv_cache_bytes=8 * 1024 * 1024,
    )
    loaded = load_embedded_engines(settings)
    try:
        config = loaded.engines[0].engine.config  # type: ignore[attr-defined]
        assert config.max_background_step_tokens == 64
    finally:
        asyncio.run(loaded.shutdown())
