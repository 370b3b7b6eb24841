"""RMSNorm, RoPE, SiLU-and-mul and the K/V write in C (native_elementwise.c), one call each.

A decode step of a small model is dispatch-bound: profiled on the demo model at 5
requests/s, these four ops were about 35 % of the engine thread (RMSNorm alone as
much as all the linears), because each is several PyTorch ops of a few microseconds
each on a few KiB. The C versions are one ctypes call per op.

Same contracts as `elementwise.py` and `attention.write_kv`, which they fall back to
for anything but float32 CPU tensors laid out as the engine lays them out (rows with
contiguous elements), or when the C library did not build. Results equal the PyTorch
ops' up to the rounding of sums (the tests compare them). Like the other cpu ops, shapes
are the engine's and not re-validated, except what C would read or write out of bounds
for: a RoPE position past the table, a slot past the cache (KernelArgumentError).
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

import torch

from hydrant.kernels.cpu import attention, elementwise, native_decode
from hydrant.kernels.errors import KernelArgumentError

_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_F32 = torch.float32
# SiLU-and-mul outputs up to this many floats go to C when it has no vector exp (libm's,
# one call per element, loses to PyTorch's vectorised SiLU beyond); with one, all do: on
# the demo model's prefill rows (a [2048, 352] view) 0.22 ms against PyTorch's 0.62
SILU_MAX_FLOATS_SCALAR = 2048


@cache
def _native() -> ctypes.CDLL | None:
    """The built library with these entry points declared; None without a C compiler."""
    library = native_decode.load()
    return None if library is None else declare(library)


def declare(library: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the entry points on a build (`_native`'s, or another one in tests)."""
    # x, x_stride, residual, r_stride, weight, eps, out, sum, rows, hidden, num_threads
    rms = library.hydrant_rms_norm_f32
    rms.argtypes = [_P, _I64, _P, _I64, _P, _F, _P, _P, _INT, _INT, _INT]
    rms.restype = None
    # positions, cos_sin, table rows, q, q_stride, heads, k, k_stride, kv heads, head_dim,
    # q_out, k_out, tokens, num_threads
    rope = library.hydrant_rope_neox_f32
    rope.argtypes = [_P, _P, _I64, _P, _I64, _INT, _P, _I64, _INT, _INT, _P, _P, _INT, _INT]
    rope.restype = _INT
    silu = library.hydrant_silu_and_mul_f32  # x, x_stride, out, rows, inter, num_threads
    silu.argtypes = [_P, _I64, _P, _INT, _INT, _INT]
    silu.restype = None
    # key, key_stride, value, value_stride, k_cache, v_cache, slots, num_slots, tokens, row
    write = library.hydrant_write_kv_f32
    write.argtypes = [_P, _I64, _P, _I64, _P, _P, _P, _I64, _INT, _INT]
    write.restype = _INT
    library.hydrant_silu_lanes.restype = _INT
    return library


@cache
def _silu_max_floats() -> int:
    library = _native()
    if library is None:
        return 0
    return sys.maxsize if library.hydrant_silu_lanes() else SILU_MAX_FLOATS_SCALAR


def available() -> bool:
    return _native() is not None


def _rows(x: torch.Tensor) -> bool:
    """A float32 CPU matrix whose rows have contiguous elements."""
    return x.dtype == _F32 and x.is_cpu and x.dim() == 2 and x.stride(1) == 1


def _heads(x: torch.Tensor) -> bool:
    """A float32 CPU [tokens, heads, head_dim] whose heads are adjacent in each token."""
    return (
        x.dtype == _F32
        and x.is_cpu
        and x.dim() == 3
        and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of `x + residual`; returns (normed, the sum) so the caller keeps the stream."""
    library = _native()
    if (
        library is None
        or not _rows(x)
        or weight.dtype != _F32
        or not weight.is_contiguous()
        or (residual is not None and (not _rows(residual) or residual.shape != x.shape))
    ):
        return elementwise.rms_norm(x, weight, eps, residual)
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=_F32)
    total = x if residual is None else torch.empty((rows, hidden), dtype=_F32)
    library.hydrant_rms_norm_f32(
        x.data_ptr(),
        x.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        weight.data_ptr(),
        eps,
        out.data_ptr(),
        total.data_ptr(),
        rows,
        hidden,
        torch.get_num_threads(),
    )
    return out, total


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE of q [T, H, D] and k [T, Hkv, D] at the given positions."""
    library = _native()
    if (
        library is None
        or not _heads(q)
        or not _heads(k)
        or positions.dtype != torch.int64
        or not positions.is_contiguous()
        or cos_sin_cache.dtype != _F32
        or not cos_sin_cache.is_contiguous()
        or cos_sin_cache.shape[-1] != q.shape[2]
    ):
        return elementwise.rotary_embedding(positions, q, k, cos_sin_cache)
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q_out = torch.empty((tokens, heads, head_dim), dtype=_F32)
    k_out = torch.empty((tokens, kv_heads, head_dim), dtype=_F32)
    status = library.hydrant_rope_neox_f32(
        positions.data_ptr(),
        cos_sin_cache.data_ptr(),
        cos_sin_cache.shape[0],
        q.data_ptr(),
        q.stride(0),
        heads,
        k.data_ptr(),
        k.stride(0),
        kv_heads,
        head_dim,
        q_out.data_ptr(),
        k_out.data_ptr(),
        tokens,
        torch.get_num_threads(),
    )
    if status != 0:
        raise KernelArgumentError(
            f"a RoPE position is outside the table's {cos_sin_cache.shape[0]} positions"
        )
    return q_out, k_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused [gate | up] projection: silu(gate) * up."""
    library = _native()
    rows = x.shape[0]
    inter = x.shape[-1] // 2
    if library is None or not _rows(x) or rows * inter > _silu_max_floats():
        return elementwise.silu_and_mul(x)
    out = torch.empty((rows, inter), dtype=_F32)
    library.hydrant_silu_and_mul_f32(
        x.data_ptr(), x.stride(0), out.data_ptr(), rows, inter, torch.get_num_threads()
    )
    return out


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's K/V [T, Hkv, D] into the cache at their slots (-1 = skip)."""
    library = _native()
    if (
        library is None
        or not _heads(key)
        or not _heads(value)
        or k_cache.dtype != _F32
        or v_cache.dtype != _F32
        or not k_cache.is_contiguous()
        or not v_cache.is_contiguous()
        or slot_mapping.dtype != torch.int64
        or not slot_mapping.is_contiguous()
        or key.shape[1:] != k_cache.shape[2:]
        or value.shape[1:] != v_cache.shape[2:]
    ):
        attention.write_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    row = k_cache.shape[2] * k_cache.shape[3]
    status = library.hydrant_write_kv_f32(
        key.data_ptr(),
        key.stride(0),
        value.data_ptr(),
        value.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        slot_mapping.data_ptr(),
        k_cache.shape[0] * k_cache.shape[1],
        key.shape[0],
        row,
    )
    if status != 0:
        raise KernelArgumentError(
            f"a K/V slot is outside the cache's {k_cache.shape[0] * k_cache.shape[1]} slots"
        )
