"""BGMV and SGMV for the CPU row: the LoRA deltas in C, each row reading its adapter in place.

A decode step calls BGMV once per fused projection per layer, on a few dozen rows of as
many adapters. In PyTorch that is a gather of every row's A and B (a [rows, R, K] and a
[rows, N, R] copy) before two batched matmuls, and the copy costs more than the
arithmetic: on the demo model with rank 8 on all seven projections and 48 rows of 32
adapters, 0.6 ms a layer (CPU time, one thread) against 0.11 ms for the layer's own four
linears. The C kernel (native_lora.c) reads each row's slot of the stacks where it lies:
0.13 ms. Prefill chunks (SGMV) go to the same kernel in one call (the reference makes
four PyTorch calls per segment), through each segment's B transposed once, skipping the
fused stacks' zero blocks: 1.2 ms a layer for 16 prompts of 1230 tokens, against 2.65 ms
for the reference and 2.2 ms for the base linears.

Only float32 CPU tensors with contiguous last dimensions take the C path (the engine's
float32 case); other dtypes, or a machine where the kernels did not build, run the
PyTorch code below (the reference for SGMV), with the same results up to summation
order. Like the other cpu ops, the arguments are the engine's and shapes are not
re-validated; the C kernel does refuse a slot index past the stacks (or a segment past
the rows), which it would otherwise read out of bounds, before it adds anything.
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from hydrant.kernels import reference
from hydrant.kernels.cpu import native_decode
from hydrant.kernels.errors import KernelArgumentError

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# x, x_t, y, y_t, a, a_s, a_r, b, b_s, b_n, b_r, scales: what both entry points take first
_COMMON: list[type[ctypes.c_void_p] | type[ctypes.c_int64]] = [
    _P,
    _I64,
    _P,
    _I64,
    _P,
    _I64,
    _I64,
    _P,
    _I64,
    _I64,
    _I64,
    _P,
]


@cache
def _native() -> ctypes.CDLL | None:
    """The built library with the LoRA entry points declared; None without a C compiler."""
    library = native_decode.load()
    if library is None:
        return None
    bgmv = library.hydrant_lora_bgmv_f32  # ..., token_slots, rows, slots, k, n, r, num_threads
    bgmv.argtypes = [*_COMMON, _P, _I64, _INT, _INT, _INT, _INT, _INT]
    bgmv.restype = _INT
    # ..., seg_starts, seg_slots, segments, rows, slots, k, n, r, num_threads
    sgmv = library.hydrant_lora_sgmv_f32
    sgmv.argtypes = [*_COMMON, _P, _P, _INT, _I64, _INT, _INT, _INT, _INT, _INT]
    sgmv.restype = _INT
    return library


def _takes_native(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
) -> bool:
    return (
        y.dtype == x.dtype == lora_a.dtype == lora_b.dtype == scales.dtype == torch.float32
        and y.device.type == "cpu"
        and scales.is_contiguous()
        and y.stride(1) == 1
        and x.stride(1) == 1
        and lora_a.stride(2) == 1
        and _native() is not None
    )


def _weights(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
) -> list[int]:
    """The arguments both entry points take first (pointers and strides in elements)."""
    return [
        x.data_ptr(),
        x.stride(0),
        y.data_ptr(),
        y.stride(0),
        lora_a.data_ptr(),
        lora_a.stride(0),
        lora_a.stride(1),
        lora_b.data_ptr(),
        *lora_b.stride(),
        scales.data_ptr(),
    ]


def _check(status: int, what: str) -> None:
    if status == -2:
        raise KernelArgumentError(f"{what} outside the stacks (nothing was added)")
    if status != 0:
        raise MemoryError("the native LoRA kernel could not allocate its row buffers")


def _int32(index: torch.Tensor) -> torch.Tensor:
    """The engine's index tensors as they are (int32, contiguous); others converted. A
    no-op `.to` still costs microseconds, and a decode step makes 16 calls per layer."""
    if index.dtype == torch.int32 and index.is_contiguous():
        return index
    return index.to(torch.int32).contiguous()


def lora_bgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    token_slots: torch.Tensor,
) -> None:
    if x.shape[0] == 0:
        return
    if not _takes_native(y, x, lora_a, lora_b, scales):
        _torch_bgmv(y, x, lora_a, lora_b, scales, token_slots)
        return
    library = _native()
    assert library is not None
    slots = _int32(token_slots)
    rank = lora_a.shape[1]
    status = library.hydrant_lora_bgmv_f32(
        *_weights(y, x, lora_a, lora_b, scales),
        slots.data_ptr(),
        x.shape[0],
        lora_a.shape[0],
        x.shape[1],
        y.shape[1],
        rank,
        torch.get_num_threads(),
    )
    _check(status, "token_slots has a slot")


def lora_sgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int | None = None,
) -> None:
    if seg_slots.shape[0] == 0:
        return
    if not _takes_native(y, x, lora_a, lora_b, scales):
        reference.lora_sgmv(y, x, lora_a, lora_b, scales, seg_starts, seg_slots, max_seg_len)
        return
    library = _native()
    assert library is not None
    starts, slots = _int32(seg_starts), _int32(seg_slots)
    status = library.hydrant_lora_sgmv_f32(
        *_weights(y, x, lora_a, lora_b, scales),
        starts.data_ptr(),
        slots.data_ptr(),
        slots.shape[0],
        x.shape[0],
        lora_a.shape[0],
        x.shape[1],
        y.shape[1],
        lora_a.shape[1],
        torch.get_num_threads(),
    )
    _check(status, "seg_slots has a slot, or seg_starts a row,")


def _torch_bgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    token_slots: torch.Tensor,
) -> None:
    """Without the C kernel: gather every row's adapter (slot -1 reads slot 0, then is left
    out), two batched matmuls, an in-place add; rows without an adapter keep their bits
    (`where`, not an added zero). Only float32 takes it; other dtypes go to the
    reference, which rounds once."""
    if y.dtype != torch.float32 or x.dtype != torch.float32 or lora_a.dtype != torch.float32:
        reference.lora_bgmv(y, x, lora_a, lora_b, scales, token_slots)
        return
    slots = token_slots.long()
    base = slots < 0
    index = slots.clamp(min=0)
    mid = torch.bmm(x.unsqueeze(1), lora_a.index_select(0, index).transpose(1, 2))
    delta = torch.bmm(mid, lora_b.index_select(0, index).transpose(1, 2)).squeeze(1)
    delta.mul_(scales.index_select(0, index)[:, None])
    if bool(base.any()):
        y.copy_(torch.where(base[:, None], y, y + delta))
    else:
        y.add_(delta)
