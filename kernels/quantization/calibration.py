"""Activation-aware channel scales (AWQ-style) from a calibration set of real prompts.

A few input channels of a transformer's linears carry activations far larger
than the rest, so a weight error in those columns costs more output error.
Scaling column j of W up by `s_j` before quantizing (and the input down by
`1 / s_j` at run time) gives those columns finer quantization steps. Per
layer, `s = mean|x|^alpha` is searched over a small alpha grid by the output
error on the recorded calibration inputs; alpha 0 is plain round-to-nearest,
so the chosen scale is never worse than RTN on the calibration set.

Inputs are recorded from one float forward pass per batch (not re-run after
each layer is quantized, as full AWQ does): cheaper, and close enough for
a transform that runs at load time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization.linear import QuantizedLinear
from hydrant.kernels.quantization.transform import QuantizationMode, default_skip

DEFAULT_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _default_run(model: nn.Module, batch: Any) -> None:
    model(batch)


def record_linear_inputs(
    model: nn.Module,
    batches: Iterable[Any],
    names: Sequence[str],
    *,
    run: Callable[[nn.Module, Any], None] = _default_run,
    max_rows: int = 512,
) -> dict[str, torch.Tensor]:
    """Float32 input rows `[<= max_rows, in_features]` seen by each named linear."""
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    counts = dict.fromkeys(names, 0)

    def hook(name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def record(_: nn.Module, inputs: tuple[Any, ...]) -> None:
            if counts[name] >= max_rows:
                return
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])[: max_rows - counts[name]]
            rows[name].append(x.to(torch.float32).cpu())
            counts[name] += x.shape[0]

        return record

    handles = [model.get_submodule(name).register_forward_pre_hook(hook(name)) for name in names]
    try:
        with torch.no_grad():
            for batch in batches:
                run(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    missing = [name for name in names if not rows[name]]
    if missing:
        raise KernelArgumentError(f"calibration never reached these layers: {missing[:5]}")
    return {name: torch.cat(chunks) for name, chunks in rows.items()}


def search_channel_scale(
    linear: nn.Linear,
    inputs: torch.Tensor,
    mode: QuantizationMode,
    group_size: int,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> torch.Tensor:
    """The `s` (float32 `[in_features]`) minimising `||x W^T - (x / s) Q(W s)^T||` on `inputs`."""
    weight = linear.weight.detach().to(torch.float32).cpu()
    reference = inputs @ weight.t()
    importance = inputs.abs().mean(dim=0).clamp(min=1e-5)
    best_scale, best_error = torch.ones_like(importance), float("inf")
    for alpha in alphas:
        scale = importance.pow(alpha)
        scale = scale / (scale.max() * scale.min()).sqrt()
        probe = nn.Linear(linear.in_features, linear.out_features, bias=False, device="meta")
        probe.weight = nn.Parameter(weight, requires_grad=False)
        quantized = QuantizedLinear.from_linear(
            probe, mode, group_size=group_size, channel_scale=scale
        )
        error = float((inputs @ quantized.dequantized_weight().t() - reference).pow(2).sum())
        if error < best_error:
            best_scale, best_error = scale, error
    return best_scale


def calibrate(
    model: nn.Module,
    batches: Iterable[Any],
    mode: QuantizationMode,
    group_size: int = 128,
    skip: Callable[[str], bool] | None = None,
    *,
    run: Callable[[nn.Module, Any], None] = _default_run,
    max_rows: int = 512,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> dict[str, torch.Tensor]:
    """Channel scales for every linear `quantize_model` would replace; pass the result to it."""
    should_skip = skip or default_skip
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and not should_skip(name)
        and not (mode == "int4" and module.in_features % group_size)
    ]
    recorded = record_linear_inputs(model, list(batches), names, run=run, max_rows=max_rows)
    linears = {name: model.get_submodule(name) for name in names}
    return {
        name: search_channel_scale(linear, recorded[name], mode, group_size, alphas)
        for name, linear in linears.items()
        if isinstance(linear, nn.Linear)
    }
