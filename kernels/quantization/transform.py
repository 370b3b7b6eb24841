"""`quantize_model`: replace a built model's `nn.Linear` modules by `QuantizedLinear`.

Embeddings are never touched (they are `nn.Embedding`, and a gather is not a
matmul) and the output head is skipped by default: it is one layer whose
error lands directly on the logits, and it is often tied to the embedding.
A layer int4 cannot hold (in_features not a multiple of the group size) is
left in float and listed in the report's `skipped`, never silently padded.

Activation-aware scaling is optional: pass `activation_scales` (from
`hydrant.kernels.quantization.calibration.calibrate`) and each listed layer
is quantized as `W * s` with the input multiplied by `1 / s` at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization.footprint import module_bytes
from hydrant.kernels.quantization.linear import QuantizedLinear

QuantizationMode = Literal["int8", "int4"]
OUTPUT_HEAD_NAMES = ("lm_head", "output", "embed_out")


def default_skip(name: str) -> bool:
    """Skip the output head (`lm_head` and its usual aliases)."""
    return name.rsplit(".", 1)[-1] in OUTPUT_HEAD_NAMES


@dataclass(frozen=True)
class QuantizationReport:
    """What `quantize_model` replaced and the bytes it saved.

    `bytes_before` / `bytes_after` cover the replaced layers (weights, bias,
    scales, zeros); `float16_bytes_before` is those layers' tensors counted at
    two bytes per element, the baseline the memory gates are stated against
    whatever dtype the model was built in. `model_bytes_*` cover everything.
    """

    mode: QuantizationMode
    group_size: int
    quantized: tuple[str, ...]
    skipped: tuple[str, ...]
    bytes_before: int
    bytes_after: int
    float16_bytes_before: int
    model_bytes_before: int
    model_bytes_after: int

    @property
    def ratio_vs_float16(self) -> float:
        """Replaced layers' bytes after quantization over their float16 size."""
        return self.bytes_after / self.float16_bytes_before if self.float16_bytes_before else 1.0


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def quantize_model(
    model: nn.Module,
    mode: QuantizationMode,
    group_size: int = 128,
    skip: Callable[[str], bool] | None = None,
    *,
    activation_scales: Mapping[str, torch.Tensor] | None = None,
) -> QuantizationReport:
    """Quantize `model` in place (round-to-nearest) and report what changed.

    `skip(name)` decides which `nn.Linear` modules (by qualified name) stay in
    float; `None` means `default_skip`. A given predicate replaces the
    default, so include `default_skip(name)` in it to keep the head in float.
    """
    if mode not in ("int8", "int4"):
        raise KernelArgumentError(f"mode must be 'int8' or 'int4', got {mode!r}")
    if mode == "int4" and (group_size <= 0 or group_size % 2):
        raise KernelArgumentError(f"int4 group_size must be a positive even number: {group_size}")
    should_skip = skip or default_skip
    model_before = module_bytes(model)
    targets: list[tuple[str, nn.Linear]] = []
    skipped: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if should_skip(name) or (mode == "int4" and module.in_features % group_size):
            skipped.append(name)
            continue
        targets.append((name, module))
    before = after = fp16_before = 0
    for name, linear in targets:
        before += module_bytes(linear)
        fp16_before += 2 * sum(p.numel() for p in linear.parameters())
        scale = activation_scales.get(name) if activation_scales else None
        quantized = QuantizedLinear.from_linear(
            linear, mode, group_size=group_size, channel_scale=scale
        )
        after += module_bytes(quantized)
        _set_submodule(model, name, quantized)
    return QuantizationReport(
        mode=mode,
        group_size=group_size if mode == "int4" else 0,
        quantized=tuple(name for name, _ in targets),
        skipped=tuple(skipped),
        bytes_before=before,
        bytes_after=after,
        float16_bytes_before=fp16_before,
        model_bytes_before=model_before,
        model_bytes_after=module_bytes(model),
    )
