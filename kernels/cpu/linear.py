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

Weights are packed once, when the model is bound, into the blocked layout
oneDNN's kernels read (`torch.ops.mkldnn._reorder_linear_weight`, what
Inductor's freezing pass does; vLLM's CPU build does the same through its own
oneDNN handler). Unpacked, oneDNN reorders the plain weight on every call:
at decode row counts (4-64) that reorder is most of the call, and packing
makes the 100M model's linears 1.3-2.7x faster there (gate/up at 16 rows
1.09 -> 0.58 ms on this machine); at prefill sizes a few per cent. The
packed tensor replaces the plain one (no second copy of the weights); the
state dict still holds plain tensors.

The oneDNN entry points (`_linear_pointwise` and `_reorder_linear_weight`,
the ones Inductor's CPU backend emits) are not public API, so they are probed
once: if the linear is missing or disagrees with `F.linear`, the model keeps
`F.linear`; if only packing fails, the linears run oneDNN on plain weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

MIN_ONEDNN_WEIGHTS = 1 << 19
# the row count oneDNN chooses the packed layout for; it serves every row count (at 8,192
# rows within 2 % of a layout packed for 8,192), and decode steps are where packing pays
PACK_ROWS_HINT = 16


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed by oneDNN."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


def _passes_probe(check: Callable[[torch.Generator], bool], what: str, instead: str) -> bool:
    """Run `check` (seeded inputs, inference mode) once: False, logged, when the entry point
    is missing or raises, or when its result disagrees with `F.linear`."""
    try:
        with torch.inference_mode():
            ok = check(torch.Generator().manual_seed(0))
    except (RuntimeError, AttributeError) as exc:
        logger.info("%s unavailable (%s); %s", what, exc, instead)
        return False
    if not ok:
        logger.warning("%s disagrees with F.linear; %s", what, instead)
    return ok


@cache
def onednn_available() -> bool:
    """True when the oneDNN linear exists here and matches `F.linear` on a probe."""
    if not torch.backends.mkldnn.is_available():
        return False

    def check(gen: torch.Generator) -> bool:
        x = torch.randn(5, 48, generator=gen)
        weight = torch.randn(40, 48, generator=gen)
        bias = torch.randn(40, generator=gen)
        got, want = onednn_linear(x, weight, bias), F.linear(x, weight, bias)
        return torch.allclose(got, want, atol=1e-4)

    return _passes_probe(check, "oneDNN linear", "float32 linears use F.linear")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's blocked layout: an opaque tensor `onednn_linear` takes
    in place of the plain weight (`.to_dense()` gives the plain one back)."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
    return packed


@cache
def packing_available() -> bool:
    """True when weights can be packed here and the packed linear matches `F.linear`."""
    if not onednn_available():
        return False

    def check(gen: torch.Generator) -> bool:
        x = torch.randn(3, 48, generator=gen)
        weight = torch.randn(40, 48, generator=gen)
        packed = pack_weight(weight)
        matches = torch.allclose(onednn_linear(x, packed), F.linear(x, weight), atol=1e-4)
        return matches and torch.equal(packed.to_dense(), weight)

    return _passes_probe(check, "oneDNN packed linear", "linears read plain weights")


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
    """An `nn.Linear` whose forward runs oneDNN, its weight usually packed (`pack_weight`).

    The state dict is an `nn.Linear`'s: a packed weight is saved as the plain
    tensor it came from, so saving or exporting a bound model sees no difference.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.weight, self.bias)

    def _save_to_state_dict(
        self, destination: dict[str, Any], prefix: str, keep_vars: bool
    ) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight"
        weight = destination.get(key)
        if isinstance(weight, torch.Tensor) and weight.is_mkldnn:
            destination[key] = weight.to_dense()


def use_onednn_linears(model: nn.Module) -> int:
    """Switch the model's large float32 CPU `nn.Linear`s to oneDNN in place; returns how many.

    Only modules whose class is exactly `nn.Linear` change (quantized linears
    keep their own kernels). The class is swapped on the live module, so its
    name and bias stay; the weight becomes a new parameter holding the packed
    tensor (when packing works here), and the plain one is freed with its
    last reference. Call it once the weights are final (after loading and
    quantizing): a packed weight is read only by oneDNN.
    """
    if not onednn_available():
        return 0
    pack = packing_available()
    swapped = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is nn.Linear and worth_onednn(module.weight):
                module.__class__ = OneDnnLinear
                if pack:
                    module.weight = nn.Parameter(pack_weight(module.weight), requires_grad=False)
                swapped += 1
    return swapped
