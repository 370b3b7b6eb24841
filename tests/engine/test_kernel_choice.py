"""The engine picks one row of the kernel table at build, from `EngineConfig.kernels`.

The names (old ones included) map to the right row for the device and dtype,
unknown ones are refused, and the choice is made once: the model, its
quantized linears and the runner's decode planning all hold the row chosen.
The reference row is the ground truth, so an engine built on it must give
the default engine's greedy tokens on every tiny model family.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from tiny_models import FAMILIES, EngineTracker, Family, build_tiny_model, random_prompts

from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.model_runner import ModelRunner
from hydrant.engine.ops import select_backend
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request
from hydrant.kernels.backends import get_backend
from hydrant.kernels.cpu import native_decode
from hydrant.kernels.cpu.backend import NATIVE, PLANNED
from hydrant.kernels.quantization import QuantizedLinear
from hydrant.kernels.reference_backend import REFERENCE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

requires_native = pytest.mark.skipif(
    not native_decode.available() and os.environ.get("CI") != "true",
    reason="no C compiler here (in CI the kernel must build)",
)


def _select(kernels: str, dtype: torch.dtype = torch.float32) -> str:
    backend = select_backend(EngineConfig(kernels=kernels), dtype)
    return f"{backend.name}:{backend.detail}"


@requires_native
def test_auto_ops_on_cpu_use_the_native_kernel_in_float32_only() -> None:
    native, planned = f"cpu:{NATIVE.detail}", f"cpu:{PLANNED.detail}"
    assert _select("auto", torch.float32) == native
    assert select_backend(EngineConfig(kernels="native"), torch.float32).has("fast_linears")
    assert _select("auto", torch.bfloat16) == planned  # the plain PyTorch path
    assert _select("cpu", torch.float32) == native


def test_native_kernels_need_the_cpu() -> None:
    with pytest.raises(EngineConfigError, match="native"):
        select_backend(EngineConfig(kernels="native", device="cuda"), torch.float32)
    with pytest.raises(EngineConfigError, match="kernels must be"):
        EngineConfig(kernels="fast")


def test_old_names_map_to_rows_of_the_table() -> None:
    assert _select("torch") == f"reference:{REFERENCE.detail}"  # the pure PyTorch path
    assert _select("hydrant") == f"reference:{REFERENCE.detail}"  # the package's CPU choice
    assert _select("reference", torch.bfloat16) == f"reference:{REFERENCE.detail}"
    for name in ("auto", "hydrant", "triton"):
        backend = select_backend(EngineConfig(kernels=name, device="cuda"), torch.float16)
        assert backend.name == "triton" and backend.has("graph_capture")


def test_triton_on_the_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(EngineConfigError, match="kernels='triton' needs a CUDA device"):
        select_backend(EngineConfig(kernels="triton"), torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(EngineConfig(kernels="triton"), torch.float32).name == "triton"


def test_a_row_without_the_int8_cache_is_refused_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = dataclasses.replace(REFERENCE, features=frozenset())
    monkeypatch.setattr("hydrant.engine.ops.get_backend", lambda *_: plain)
    with pytest.raises(EngineConfigError, match="no int8 KV cache"):
        select_backend(EngineConfig(kernels="reference", kv_cache_dtype="int8"), torch.float32)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[Family, Path]:
    root = tmp_path_factory.mktemp("choice")
    return {family: build_tiny_model(root / family, family, seed=3) for family in FAMILIES}


def _runner(engine: LLMEngine) -> ModelRunner:
    assert isinstance(engine.runner, ModelRunner)
    return engine.runner


def _greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"r{i}", prompt, params))
    finals: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = list(output.outputs[0].token_ids)
    return [finals[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_backend_gives_the_default_engines_tokens(
    family: Family, model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    """Chunked prefill mixed with batched decodes, on each backend's own code paths."""
    prompts = random_prompts(6, 1, 90, seed=21)
    chunked = {"max_num_batched_tokens": 64, "short_lane_tokens": 64, "long_lane_tokens": 32}
    default = engines.make(model_dirs[family], **chunked)
    reference = engines.make(model_dirs[family], kernels="reference", **chunked)
    assert _runner(default).model.ops.name == "cpu"
    assert _runner(reference).model.ops is REFERENCE
    assert _runner(reference).decode_planner is None
    assert _greedy(reference, prompts) == _greedy(default, prompts)


def test_quantized_linears_run_the_chosen_row(
    model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    engine = engines.make(model_dirs["gqa"], kernels="reference", quantization="int8")
    model = _runner(engine).model
    quantized = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert quantized and all(m.backend is REFERENCE for m in quantized)
    assert all(layer.self_attn.ops is REFERENCE for layer in model.model.layers)
    planned = engines.make(model_dirs["gqa"], dtype="bfloat16")
    assert _runner(planned).model.ops is PLANNED is get_backend("cpu", torch.bfloat16)
    assert _runner(planned).decode_planner is not None  # planned decode: one plan per step
