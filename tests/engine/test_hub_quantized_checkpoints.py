"""AWQ and GPTQ checkpoints served by the engine, against their formats' published specs.

Each tiny checkpoint is written by `hub_checkpoints` (the exporters' bit loops,
random codes). The engine must load it into `QuantizedLinear` modules whose
dequantized weights equal the spec's dequantization exactly (q/k/v and gate/up
fused along N), and generate greedily the same tokens as transformers' dense
model holding those weights. Variants Hydrant cannot serve exactly are refused
with the offending field named, before or while loading, never served wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hub_checkpoints import (
    ENGINE_MODULES,
    NEW_TOKENS,
    HubPair,
    awq_config,
    awq_tensors,
    engine_greedy,
    gptq_config,
    gptq_tensors,
    write_pair,
)
from safetensors.torch import load_file, save_file
from tiny_models import (
    EngineTracker,
    Family,
    build_tiny_model,
    hf_greedy,
    load_hf_model,
    random_prompts,
)
from torch import nn

from hydrant.engine.capacity_shapes import ModelShape
from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.errors import ModelLoadError
from hydrant.engine.hub_quant_config import parse_hub_quantization
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.ops import bind_linears, select_backend
from hydrant.kernels.quantization import QuantizedLinear
from hydrant.kernels.reference_backend import REFERENCE

KEEP_FLOAT = "model.layers.1.mlp.down_proj"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("float"), "gqa", seed=7)


def check_weights(engine: LLMEngine, pair: HubPair, keep_float: tuple[str, ...] = ()) -> None:
    """Every engine module holds exactly the spec's weights of the projections it fuses."""
    model = engine.runner.model
    layers = len(model.model.layers)
    for layer in range(layers):
        for module_name, parts in ENGINE_MODULES.items():
            module = model.get_submodule(f"model.layers.{layer}.{module_name}")
            names = [f"model.layers.{layer}.{part}" for part in parts]
            expected = torch.cat([pair.weights[name] for name in names])
            if any(name in keep_float for name in names):
                assert isinstance(module, nn.Linear), module_name
                assert torch.equal(module.weight, expected)
                continue
            assert isinstance(module, QuantizedLinear), module_name
            assert module.mode == "int4"
            assert torch.equal(module.dequantized_weight(), expected), module_name


def check_greedy(engine: LLMEngine, pair: HubPair) -> None:
    """The engine's greedy tokens are transformers' on the dense twin's weights."""
    prompts = random_prompts(3, 4, 24, seed=2)
    hf = load_hf_model(pair.dense)
    expected = [hf_greedy(hf, prompt, NEW_TOKENS) for prompt in prompts]
    assert engine_greedy(engine, prompts) == expected


def make_awq(group: int) -> Callable[[int, int, torch.Generator], Any]:
    return lambda n, k, gen: awq_tensors(n, k, group, gen)


def make_gptq(group: int, symmetric: bool, v2: bool) -> Callable[..., Any]:
    return lambda n, k, gen: gptq_tensors(n, k, group, symmetric, v2, gen)


@pytest.mark.parametrize("family", ["gqa", "qwen2"])
def test_awq_checkpoint_loads_exactly_and_follows_the_dense_model(
    float_dir: Path, tmp_path: Path, engines: EngineTracker, family: Family
) -> None:
    # qwen2: q/k/v biases (float, fused beside the codes) and a tied head
    source = float_dir if family == "gqa" else build_tiny_model(tmp_path / family, family, seed=3)
    # one projection listed in modules_to_not_convert stays float, as AutoAWQ writes it
    pair = write_pair(
        source, tmp_path, awq_config(32, [KEEP_FLOAT]), make_awq(32), keep_float=(KEEP_FLOAT,)
    )
    engine = engines.make(pair.quantized)
    check_weights(engine, pair, keep_float=(KEEP_FLOAT,))
    check_greedy(engine, pair)


@pytest.mark.parametrize(
    ("group", "symmetric", "v2"),
    [(32, True, False), (-1, False, False), (64, False, True)],
    ids=["sym-g32", "asym-per-channel", "asym-g64-v2"],
)
def test_gptq_checkpoint_loads_exactly_and_follows_the_dense_model(
    float_dir: Path,
    tmp_path: Path,
    engines: EngineTracker,
    group: int,
    symmetric: bool,
    v2: bool,
) -> None:
    pair = write_pair(
        float_dir, tmp_path, gptq_config(group, symmetric, v2), make_gptq(group, symmetric, v2)
    )
    engine = engines.make(pair.quantized, quantization="int4")  # agreeing with it is fine
    check_weights(engine, pair)
    check_greedy(engine, pair)


def test_hub_linears_run_under_the_triton_kernels_the_engine_binds(
    float_dir: Path, tmp_path: Path, engines: EngineTracker
) -> None:
    pytest.importorskip("triton")
    pair = write_pair(float_dir, tmp_path, awq_config(32), make_awq(32))
    model = engines.make(pair.quantized, kernels="reference").runner.model
    triton = select_backend(EngineConfig(kernels="triton"), torch.float32)
    linear = model.get_submodule("model.layers.0.self_attn.qkv_proj")
    assert isinstance(linear, QuantizedLinear)
    generator = torch.Generator().manual_seed(0)
    for rows in (2, 40):  # the decode GEMV and the tiled matmul
        x = torch.randn(rows, linear.in_features, generator=generator)
        expected = x @ linear.dequantized_weight().t()
        bind_linears(model, REFERENCE)
        assert torch.allclose(linear(x), expected, atol=1e-4, rtol=1e-4)
        bind_linears(model, triton)
        assert linear.backend is triton
        assert torch.allclose(linear(x), expected, atol=1e-4, rtol=1e-4)


# ---- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({**gptq_config(128, True), "desc_act": True}, "desc_act"),
        ({**gptq_config(128, True), "bits": 3}, "bits"),
        ({**gptq_config(128, True), "bits": 8}, "bits"),
        ({**gptq_config(128, True), "checkpoint_format": "marlin"}, "checkpoint_format"),
        ({**gptq_config(128, True), "group_size": 0}, "group_size"),
        ({**awq_config(128), "version": "gemv"}, "version"),
        ({**awq_config(128), "version": "exllama"}, "version"),
        ({**awq_config(128), "bits": 3}, "bits"),
        ({"quant_method": "fp8"}, "quant_method"),
    ],
)
def test_unsupported_awq_and_gptq_variants_are_refused(section: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelLoadError, match=rf"quantization_config\.{field} = "):
        parse_hub_quantization(section)


def test_a_desc_act_checkpoint_is_refused_at_load(float_dir: Path, tmp_path: Path) -> None:
    config = {**gptq_config(32, True), "desc_act": True}
    pair = write_pair(float_dir, tmp_path, config, make_gptq(32, True, False))
    settings = EngineConfig(kv_cache_bytes=1 << 22, show_progress=False)
    with pytest.raises(ModelLoadError, match="desc_act = True"):
        LLMEngine.from_pretrained(pair.quantized, settings)


def test_reordered_rows_are_refused_even_when_desc_act_says_false(
    float_dir: Path, tmp_path: Path
) -> None:
    pair = write_pair(float_dir, tmp_path, gptq_config(32, True), make_gptq(32, True, False))
    path = pair.quantized / "model.safetensors"
    tensors = load_file(str(path))
    name = "model.layers.0.mlp.up_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    settings = EngineConfig(kv_cache_bytes=1 << 22, show_progress=False)
    with pytest.raises(ModelLoadError, match="g_idx"):
        LLMEngine.from_pretrained(pair.quantized, settings)


def test_a_contradicting_quantization_setting_is_a_config_error(
    float_dir: Path, tmp_path: Path
) -> None:
    pair = write_pair(float_dir, tmp_path, awq_config(32), make_awq(32))
    settings = EngineConfig(quantization="int8", kv_cache_bytes=1 << 22, show_progress=False)
    with pytest.raises(EngineConfigError, match="awq int4 g32"):
        LLMEngine.from_pretrained(pair.quantized, settings)


def test_a_partly_quantized_fused_module_is_refused(float_dir: Path, tmp_path: Path) -> None:
    pair = write_pair(
        float_dir,
        tmp_path,
        awq_config(32),
        make_awq(32),
        keep_float=("model.layers.0.self_attn.k_proj",),
    )
    settings = EngineConfig(kv_cache_bytes=1 << 22, show_progress=False)
    with pytest.raises(ModelLoadError, match="qkv_proj fuses 3 projections"):
        LLMEngine.from_pretrained(pair.quantized, settings)
    config = json.loads((pair.quantized / "config.json").read_text("utf-8"))
    assert config["quantization_config"]["quant_method"] == "awq"


def test_capacity_sizes_a_hub_checkpoints_weights_as_quantized() -> None:
    config = {
        "num_attention_heads": 32,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "torch_dtype": "float16",
    }
    assert ModelShape.from_config(config).default_dtype == "float16"
    assert (
        ModelShape.from_config({**config, "quantization_config": awq_config(128)}).default_dtype
        == "int4"
    )
    refused = {**gptq_config(128, True), "desc_act": True}
    assert (
        ModelShape.from_config({**config, "quantization_config": refused}).default_dtype
        == "float16"
    )
