"""gemlite (Mobius Labs' Triton low-bit kernels) as the peer of Hydrant's W4A16/W8A16 matmuls.

`gpu_kernels.py` times gemlite on the very codes, scales and zeros Hydrant's
kernels read (gemlite's HQQ convention `W ~ (W_q - zeros) * scales` is Hydrant's
int4 layout unpacked; its A16W8 takes Hydrant's int8 codes and per-row scales),
so the two differ only in kernels. gemlite picks a kernel family by M (GEMV
variants for M <= 4, split-K GEMM below 64, GEMM above); "its best" here is the
fastest of the families that run the shape correctly, each checked against
Hydrant's PyTorch reference first.

gemlite ships autotuned launch configs per GPU (`configs/h100.json`, ...), picked
by the device's name. An H200 has no file of its own: the H100's (the same SM 9.0
chip, with more memory bandwidth) is loaded instead of autotuning each shape
inside a short device slot; `gemlite_config` in the JSON says which was used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from gpu_common import log, rel_err, time_calls

# Kernel families worth trying at each M (gemlite's own choice is among them).
FAMILIES_BY_M = {
    "gemv": ("GEMV_REVSPLITK", "GEMV_SPLITK", "GEMV", "GEMM_SPLITK"),
    "small": ("GEMM_SPLITK", "GEMM", "GEMV_REVSPLITK"),
    "large": ("GEMM", "GEMM_SPLITK"),
}
MAX_REL_ERR = 2e-2


def load_gemlite() -> tuple[Any, str] | None:
    """The gemlite module and the config file it runs with; None where it is not installed."""
    try:
        import gemlite
        from gemlite import core
    except Exception as exc:  # missing wheel or a Triton it does not support: the column is empty
        log(f"gemlite unavailable: {type(exc).__name__}: {exc}")
        return None
    chosen = core.get_default_cache_config()
    if chosen is None:
        fallback = Path(core.__file__).parent / "configs" / "h100.json"
        if "H200" in torch.cuda.get_device_name() and fallback.is_file():
            gemlite.load_config(str(fallback))
            chosen = str(fallback)
    return gemlite, Path(chosen).name if chosen else "autotune"


def families(m: int) -> tuple[str, ...]:
    if m <= 4:
        return FAMILIES_BY_M["gemv"]
    return FAMILIES_BY_M["small"] if m < 64 else FAMILIES_BY_M["large"]


def layers(
    q4: torch.Tensor,
    s4: torch.Tensor,
    z4: torch.Tensor,
    group: int,
    q8: torch.Tensor,
    s8: torch.Tensor,
    copies: int,
) -> dict[str, list[Any]]:
    """gemlite layers over Hydrant's own quantized weights, `copies` of each (L2 defeat)."""
    from gemlite.helper import A16W8, A16Wn

    from hydrant.kernels.int4_layout import unpack_int4

    device = str(q4.device)
    codes = unpack_int4(q4)
    out: dict[str, list[Any]] = {"w4": [], "w8": []}
    for _ in range(copies):
        out["w4"].append(
            A16Wn(device=device, dtype=torch.float16).from_weights(
                codes.clone(), s4.clone(), z4.clone(), 4, group
            )
        )
        out["w8"].append(
            A16W8(device=device, dtype=torch.float16).from_weights(
                q8.clone(), scales=s8.clone().view(-1, 1)
            )
        )
    return out


def best(
    kind: str,
    layer_copies: list[Any],
    x: torch.Tensor,
    reference: torch.Tensor,
    reps: int,
) -> dict[str, Any]:
    """Microseconds of the fastest correct gemlite family for this shape, and each family's."""
    m = x.shape[0]
    result: dict[str, Any] = {}
    timings: dict[str, float] = {}
    modes: dict[str, str] = {}
    for family in families(m):
        try:
            first = layer_copies[0].forward_manual(x, family)
            err = rel_err(first, reference)
            if err > MAX_REL_ERR:
                result[f"gemlite_{kind}_{family}"] = f"wrong (rel_err {err:.1e})"
                continue
            calls: list[Callable[[], Any]] = [
                (lambda layer=layer, f=family: layer.forward_manual(x, f)) for layer in layer_copies
            ]
            seconds, mode = time_calls(calls, x.device, reps)
            timings[family] = seconds * 1e6
            modes[family] = mode
        except Exception as exc:  # a family that does not take this M or shape
            result[f"gemlite_{kind}_{family}"] = f"{type(exc).__name__}"
    if timings:
        family = min(timings, key=timings.__getitem__)
        result[f"gemlite_{kind}_us"] = timings[family]
        result[f"gemlite_{kind}_kernel"] = family
        result[f"gemlite_{kind}_timing"] = modes[family]  # "eager" would count Python calls
    result[f"gemlite_{kind}_families_us"] = timings
    return result
