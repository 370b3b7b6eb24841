"""compressed-tensors `pack-quantized` checkpoints, against the library's own decompression.

The checkpoints are written the way llm-compressor writes them: a tiny
transformers Llama gets a `QuantizationConfig` applied by the library, min-max
scales from the library's `calculate_qparams`, and is compressed by its
`ModelCompressor` and saved with `update_config`. The same in-memory model is
then decompressed by the library; the engine's dequantized weights must equal
those exactly, and its greedy tokens must be transformers' on a dense
checkpoint holding them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import EngineTracker, build_tiny_model, hf_greedy, load_hf_model, random_prompts
from torch import nn

from hydrant.engine.errors import ModelLoadError
from hydrant.engine.hub_quant_config import parse_hub_quantization
from hydrant.kernels.quantization import QuantizedLinear

ct = pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402
from hub_checkpoints import ENGINE_MODULES, NEW_TOKENS, engine_greedy  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("float"), "gqa", seed=11)


def write_compressed(
    float_dir: Path, out_dir: Path, weights: QuantizationArgs
) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """The library's pack-quantized checkpoint, a dense twin of its decompression, and the
    decompressed weight of every projection (by module name)."""
    model = load_hf_model(float_dir)
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=["lm_head"],
        format="pack-quantized",
    )
    apply_quantization_config(model, config)
    with torch.no_grad():  # min-max calibration, as llm-compressor's default observer
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None:
                continue
            weight = module.weight
            group = scheme.weights.group_size or weight.shape[1]
            grouped = weight.reshape(weight.shape[0], -1, group)
            scale, zero_point = calculate_qparams(
                grouped.amin(-1), grouped.amax(-1), scheme.weights
            )
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero_point.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    quantized_dir, dense_dir = out_dir / "quantized", out_dir / "dense"
    model.save_pretrained(quantized_dir)
    compressor.update_config(str(quantized_dir))
    compressor.decompress_model(model)
    decompressed = {
        name: module.weight.detach().clone()
        for name, module in model.named_modules()
        if getattr(module, "quantization_scheme", None) is not None
    }
    state = load_file(str(float_dir / "model.safetensors"))
    state.update({f"{name}.weight": weight for name, weight in decompressed.items()})
    dense_dir.mkdir()
    save_file(state, str(dense_dir / "model.safetensors"), metadata={"format": "pt"})
    for path in float_dir.iterdir():
        if path.name != "model.safetensors":
            shutil.copy2(path, dense_dir / path.name)
        if path.name.startswith("tokenizer"):
            shutil.copy2(path, quantized_dir / path.name)
    return quantized_dir, dense_dir, decompressed


SCHEMES = {
    "int4-group-sym": QuantizationArgs(num_bits=4, strategy="group", group_size=32),
    "int4-group-asym": QuantizationArgs(
        num_bits=4, strategy="group", group_size=32, symmetric=False
    ),
    "int4-channel-asym": QuantizationArgs(num_bits=4, strategy="channel", symmetric=False),
    "int8-channel": QuantizationArgs(num_bits=8, strategy="channel"),
}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_pack_quantized_equals_the_library_decompression_and_the_dense_model(
    float_dir: Path, tmp_path: Path, engines: EngineTracker, scheme: str
) -> None:
    quantized_dir, dense_dir, decompressed = write_compressed(float_dir, tmp_path, SCHEMES[scheme])
    section = json.loads((quantized_dir / "config.json").read_text("utf-8"))
    assert section["quantization_config"]["format"] == "pack-quantized"
    engine = engines.make(quantized_dir)
    model = engine.runner.model
    for layer in range(len(model.model.layers)):
        for module_name, parts in ENGINE_MODULES.items():
            module = model.get_submodule(f"model.layers.{layer}.{module_name}")
            assert isinstance(module, QuantizedLinear)
            assert module.mode == ("int8" if scheme.startswith("int8") else "int4")
            expected = torch.cat(
                [decompressed[f"model.layers.{layer}.{part}"].float() for part in parts]
            )
            assert torch.equal(module.dequantized_weight(), expected), module_name
    assert isinstance(model.lm_head, nn.Linear)  # listed in `ignore`
    prompts = random_prompts(3, 4, 24, seed=4)
    hf = load_hf_model(dense_dir)
    assert engine_greedy(engine, prompts) == [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def _ct_section(weights: dict[str, Any], **scheme: Any) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "int", "symmetric": True, **weights},
                "input_activations": None,
                **scheme,
            }
        },
        "ignore": ["lm_head"],
    }


INT4 = {"num_bits": 4, "strategy": "group", "group_size": 128}


@pytest.mark.parametrize(
    ("section", "field"),
    [
        (_ct_section(INT4, input_activations={"num_bits": 8, "type": "int"}), "input_activations"),
        (_ct_section({**INT4, "num_bits": 3}), "num_bits"),
        (_ct_section({**INT4, "strategy": "tensor"}), "strategy"),
        (_ct_section({**INT4, "type": "float"}), "type"),
        (_ct_section({"num_bits": 8, "strategy": "group", "group_size": 128}), "strategy"),
        (_ct_section({"num_bits": 8, "strategy": "channel", "symmetric": False}), "symmetric"),
        (_ct_section(INT4, format="float-quantized"), "format"),
        ({**_ct_section(INT4), "format": "naive-quantized"}, "format"),
        ({**_ct_section(INT4), "kv_cache_scheme": {"num_bits": 8}}, "kv_cache_scheme"),
    ],
)
def test_unsupported_compressed_tensors_variants_are_refused(
    section: dict[str, Any], field: str
) -> None:
    with pytest.raises(ModelLoadError, match=rf"quantization_config\.\S*{field} = "):
        parse_hub_quantization(section)


def test_mixed_int4_and_int8_groups_are_refused() -> None:
    section = _ct_section(INT4)
    section["config_groups"]["group_1"] = {
        "targets": ["re:.*down_proj"],
        "weights": {"type": "int", "num_bits": 8, "strategy": "channel", "symmetric": True},
    }
    with pytest.raises(ModelLoadError, match="one weight scheme for all"):
        parse_hub_quantization(section)
