"""Hydrant's quantized linears as compressed-tensors `pack-quantized` tensors, for other engines.

compressed-tensors' `pack-quantized` format (what llm-compressor writes for
vLLM, and what transformers decompresses) stores, per linear `NAME`:

- `NAME.weight_packed`: int32 `[N, ceil(K * bits / 32)]`, the codes as signed
  values offset by `2**(bits - 1)` (so unsigned `0 .. 2**bits - 1`), packed
  `32 // bits` to a word along K, sequentially;
- `NAME.weight_scale`: `[N, K // group_size]` (strategy group) or `[N, 1]`
  (strategy channel), in the model's dtype;
- `NAME.weight_zero_point` (asymmetric only): the signed integer zero points,
  offset and packed like the codes but along N: int32 `[ceil(N * bits / 32), G]`;
- `NAME.weight_shape`: `[N, K]` (int64), since packing pads K;

with `w = (q - zero_point) * scale` on the signed values. Hydrant's two modes
map onto it exactly:

- int8 is symmetric per output channel (`w = q * s`, q in -127..127): strategy
  channel, symmetric, 8 bits, no zero point;
- int4 is asymmetric per group (`w = (u - z) * s`, u in 0..15): strategy group.
  With `q = u - 8` and `zero_point = z - 8` the product is the same number, so
  the stored unsigned code is Hydrant's `u` itself and the stored zero is `z`.

Two things Hydrant can hold have no place in the format, and are refused
rather than approximated (a silently different model is worse than an error):
an `input_scale` (activation-aware calibration multiplies the input at run
time; pack-quantized has no such tensor) and non-integer int4 zero points
(compressed-tensors stores integer zero points). Round-to-nearest, what
`hydrant models quantize` runs, writes integer zeros 0..15 and no input scale.

This module converts one linear at a time; the engine's exporter maps its
fused modules back to the Hugging Face names and writes the checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.int4_layout import unpack_int4
from hydrant.kernels.quantization.int32_packing import pack_int32
from hydrant.kernels.quantization.linear import QuantizedLinear, QuantMode

FORMAT = "pack-quantized"
QUANT_METHOD = "compressed-tensors"
# The compressed-tensors release whose format this writer follows and is tested against
# (the "version" llm-compressor records; the library is not a runtime dependency).
FORMAT_VERSION = "0.20.1"
BITS: dict[QuantMode, int] = {"int8": 8, "int4": 4}


def _pack_along(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned codes along `dim`, padding it with code 0 to whole words as the library does.

    compressed-tensors packs a dimension that is not a multiple of `32 // bits`
    by padding it; the padding is cut off again by `weight_shape` on read.
    """
    per_word = 32 // bits
    pad = -codes.shape[dim] % per_word
    if pad:
        shape = list(codes.shape)
        shape[dim] = pad
        codes = torch.cat([codes, codes.new_zeros(shape)], dim=dim)
    return pack_int32(codes, bits, dim=dim).contiguous()  # packed along N: a moved view


def integer_zero_points(zeros: torch.Tensor, name: str) -> torch.Tensor:
    """Hydrant's float int4 zero points as integers 0..15, or a clear refusal.

    Zeros are floats in Hydrant's layout so that activation-aware search may
    place them between integers; such a layer cannot be written exactly.
    """
    z = zeros.to(torch.float32)
    rounded = torch.round(z)
    if not bool(torch.equal(rounded, z)) or bool(((rounded < 0) | (rounded > 15)).any()):
        raise KernelArgumentError(
            f"{name}: its int4 zero points are not integers in 0..15, which compressed-tensors "
            "cannot store; quantize the float checkpoint by round-to-nearest instead"
        )
    return rounded.to(torch.int64)


def pack_quantized_tensors(
    module: QuantizedLinear, rows: slice = slice(None), name: str = "linear"
) -> dict[str, torch.Tensor]:
    """The pack-quantized tensors (local names) of output rows `rows` of `module`.

    Rows are independent in both modes (scales and zeros are per row), so a
    fused module split along N gives each part exactly its own codes. The
    bias, if any, is returned under `bias` with the same rows.
    """
    if module.input_scale is not None:
        raise KernelArgumentError(
            f"{name}: it was quantized with activation-aware calibration (an input scale), "
            "which compressed-tensors pack-quantized cannot express"
        )
    bits = BITS[module.mode]
    # stored codes are the signed values plus 2**(bits - 1): int8's q + 128, and int4's
    # unsigned u and zero z as they are (module docstring)
    if module.mode == "int8":
        codes = module.qweight[rows].to(torch.int64) + 128
        scale = module.scales[rows][:, None]
        zero_codes = None
    else:
        if module.zeros is None:
            raise KernelArgumentError(f"{name}: an int4 linear without zero points")
        codes = unpack_int4(module.qweight[rows]).to(torch.int64)
        scale = module.scales[rows]
        zero_codes = integer_zero_points(module.zeros[rows], name)
    out_features, in_features = codes.shape
    tensors = {
        "weight_packed": _pack_along(codes, bits, dim=1),
        "weight_scale": scale.contiguous().clone(),
        "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int64),
    }
    if zero_codes is not None:
        tensors["weight_zero_point"] = _pack_along(zero_codes, bits, dim=0)
    if module.bias is not None:
        tensors["bias"] = module.bias[rows].contiguous().clone()
    return tensors


def quantization_config(mode: QuantMode, group_size: int, ignore: list[str]) -> dict[str, Any]:
    """The `quantization_config` entry of `config.json`, as llm-compressor writes it.

    `ignore` lists the linears left in float (the output head, layers int4's
    group size does not divide) by their Hugging Face module names; every
    other `Linear` is a target, which is how loaders decide what to unpack.
    """
    weights: dict[str, Any] = {
        "num_bits": BITS[mode],
        "type": "int",
        "symmetric": mode == "int8",
        "strategy": "channel" if mode == "int8" else "group",
        "group_size": None if mode == "int8" else group_size,
        "dynamic": False,
        "actorder": None,
        "block_structure": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": FORMAT,
            }
        },
        "format": FORMAT,
        "global_compression_ratio": None,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": FORMAT_VERSION,
    }
