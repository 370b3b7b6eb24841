"""Write a quantized engine model as a compressed-tensors checkpoint other engines load.

`hydrant models quantize --format compressed-tensors` ends here: the model has
been quantized in the engine's layout (fused `qkv_proj` / `gate_up_proj`), and
vLLM and transformers expect the Hugging Face layout (`q_proj`, `k_proj`, ...).
Rows of a fused linear are independent in both of Hydrant's modes (scales and
zeros are per output row), so each fused module is split back along N with
its codes untouched; float tensors keep their Hugging Face names. The codes
themselves are converted by `hydrant.kernels.quantization.compressed_tensors_writer`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from hydrant.engine.errors import ModelLoadError
from hydrant.engine.loader import SINGLE_FILE, unfused_parts
from hydrant.engine.model import LlamaForCausalLM
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization import QuantizationReport, QuantizedLinear
from hydrant.kernels.quantization.compressed_tensors_writer import (
    pack_quantized_tensors,
    quantization_config,
)

CONFIG_FILE = "config.json"


def _hf_parts(
    name: str, rows: int, parts: dict[str, list[tuple[str, int]]]
) -> Iterator[tuple[str, slice]]:
    """The Hugging Face module names of engine module `name` and the rows each one owns."""
    prefix, _, leaf = name.rpartition(".")
    if leaf not in parts:
        yield name, slice(None)
        return
    sizes = parts[leaf]
    if sum(size for _, size in sizes) != rows:
        raise ModelLoadError(f"{name} has {rows} rows, not the {sizes} of its parts")
    start = 0
    for proj, size in sizes:
        yield f"{prefix}.{proj}", slice(start, start + size)
        start += size


def compressed_tensors_state(
    model: LlamaForCausalLM,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(every tensor under its Hugging Face name, the linears left in float).

    Quantized linears become their pack-quantized tensors; every other tensor
    (embeddings, norms, float linears such as the head) is written as is,
    split when it belongs to a fused module.
    """
    parts = unfused_parts(model.config)
    state: dict[str, torch.Tensor] = {}
    ignore: list[str] = []
    quantized: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            quantized.add(name)
            for hf_name, rows in _hf_parts(name, module.out_features, parts):
                try:
                    tensors = pack_quantized_tensors(module, rows, hf_name)
                except KernelArgumentError as exc:
                    raise ModelLoadError(str(exc)) from exc
                state |= {f"{hf_name}.{key}": tensor for key, tensor in tensors.items()}
        elif isinstance(module, nn.Linear):
            ignore += [hf_name for hf_name, _ in _hf_parts(name, module.out_features, parts)]
    for key, tensor in model.state_dict().items():
        module_name, _, leaf = key.rpartition(".")
        if module_name in quantized:
            continue
        rows_of = tensor.shape[0] if tensor.dim() else 0
        for hf_name, rows in _hf_parts(module_name, rows_of, parts):
            # a part of a fused tensor is cloned: safetensors refuses tensors sharing storage
            whole = rows == slice(None)
            state[f"{hf_name}.{leaf}"] = tensor.contiguous() if whole else tensor[rows].clone()
    if "lm_head" not in ignore:  # llm-compressor always lists it; harmless when tied
        ignore.insert(0, "lm_head")
    return state, ignore


def save_compressed_tensors(model: LlamaForCausalLM, report: QuantizationReport, dst: Path) -> None:
    """Write `model.safetensors` and add the `quantization_config` to `dst/config.json`.

    `config.json` must already be in `dst` (copied from the float checkpoint):
    the entry is added to the model's own config, as llm-compressor does.
    """
    state, ignore = compressed_tensors_state(model)
    save_file(state, str(dst / SINGLE_FILE), metadata={"format": "pt"})
    config_path = dst / CONFIG_FILE
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["quantization_config"] = quantization_config(report.mode, report.group_size, ignore)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
