"""Float32 linears through oneDNN on the CPU, instead of the BLAS behind `F.linear`.

Why: PyTorch's x86 wheels send float32 `F.linear` to MKL, which on non-Intel
CPUs (AMD EPYC here) runs its AVX2 kernels; oneDNN, bundled in the same
wheel, JITs AVX-512 kernels for whatever CPU it finds. At the row counts of
decode steps (tens to hundreds of rows) that is 1.4-1.9x faster on this
machine (bench/engine_throughput.py times both in its compute floor), and
decode steps are most of a serving engine's matmuls. Results differ from
MKL's only in summation order (a few ulp).

Small weights stay on `F.linear`: oneDNN's fixed cost per call (and per new
row count, when it builds a primitive) outweighs its faster inner loops below
about half a million weights (a 128-wide demo model runs 3x slower on it),
so only weights of at least `MIN_ONEDNN_WEIGHTS` elements switch.

The oneDNN entry point (`torch.ops.mkldnn._linear_pointwise`, the one
Inductor's CPU backend emits) is not public API, so it is probed once: if it
is missing or disagrees with `F.linear`, the model keeps `F.linear`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

MIN_ONEDNN_WEIGHTS = 1 << 19


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed by oneDNN."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


@cache
def onednn_available() -> bool:
    """True when the oneDNN linear exists here and matches `F.linear` on a probe."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(5, 48, generator=gen)
        weight = torch.randn(40, 48, generator=gen)
        bias = torch.randn(40, generator=gen)
        with torch.inference_mode():
            got, want = onednn_linear(x, weight, bias), F.linear(x, weight, bias)
        ok = torch.allclose(got, want, atol=1e-4)
    except (RuntimeError, AttributeError) as exc:
        logger.info("oneDNN linear unavailable (%s); float32 linears use F.linear", exc)
        return False
    if not ok:
        logger.warning("oneDNN linear disagrees with F.linear; float32 linears use F.linear")
    return ok


def worth_onednn(weight: torch.Tensor) -> bool:
    """A float32 CPU weight large enough that oneDNN's speed outweighs its per-call cost."""
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and weight.numel() >= MIN_ONEDNN_WEIGHTS
    )


def linear_for(weight: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The matmul for one weight used outside an `nn.Linear` (the LM head, which may be the
    tied embedding): oneDNN when it is here and worth it for this weight, else `F.linear`."""
    return onednn_linear if onednn_available() and worth_onednn(weight) else F.linear


class OneDnnLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) whose forward runs oneDNN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.weight, self.bias)


def use_onednn_linears(model: nn.Module) -> int:
    """Switch the model's large float32 CPU `nn.Linear`s to oneDNN in place; returns how many.

    Only modules whose class is exactly `nn.Linear` change (quantized linears
    keep their own kernels). The class is swapped on the live module, so the
    parameters, their names and any references to them stay as they are.
    """
    if not onednn_available():
        return 0
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Linear and worth_onednn(module.weight):
            module.__class__ = OneDnnLinear
            swapped += 1
    return swapped
