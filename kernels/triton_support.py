"""What every Triton launcher needs: device checks, dot dtypes, block sizes.

Importing this module imports Triton, so only the launchers import it and
the `triton` row of the kernel table (`triton_backend.py`) imports the
launchers lazily: a CPU-only process (or a test session that has not set
`TRITON_INTERPRET` yet) never loads Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import require
from hydrant.kernels.errors import KernelBackendError
from hydrant.kernels.triton_backend import triton_interpreter_enabled

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def check_triton_device(device: torch.device) -> None:
    """Triton runs on CUDA, or on the CPU through the interpreter; nowhere else."""
    if device.type == "cuda":
        return
    if device.type == "cpu" and triton_interpreter_enabled():
        return
    raise KernelBackendError(
        f"the Triton backend cannot run on {device}: use CUDA tensors, set TRITON_INTERPRET=1 "
        "before triton is imported (tests), or choose backend='reference'"
    )


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The operand dtype for `tl.dot` when activations have `dtype`.

    The interpreter stores bfloat16 as raw uint16 and its `dot` would multiply
    the bit patterns, so bfloat16 operands are widened to float32 there. On
    CUDA they stay bfloat16 (tensor cores).
    """
    if dtype == torch.bfloat16 and triton_interpreter_enabled():
        return tl.float32
    return _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """float32 operands must not silently become TF32 (it would break the 1e-3 bound)."""
    return "ieee" if dot_dtype(dtype) == tl.float32 else "tf32"


def require_unit_stride(tensor: torch.Tensor, name: str) -> None:
    """Kernels index the last dimension as contiguous; other strides are passed in."""
    require(
        tensor.shape[-1] <= 1 or tensor.stride(-1) == 1,
        f"{name} must be contiguous in its last dimension (stride {tensor.stride()})",
    )


def require_contiguous(tensor: torch.Tensor, name: str) -> None:
    require(tensor.is_contiguous(), f"{name} must be contiguous (stride {tensor.stride()})")


def require_out(
    out: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    """Validate a caller-provided output buffer (tests pass NaN-poisoned ones)."""
    require(
        tuple(out.shape) == shape and out.dtype == dtype and out.device == device,
        f"{name} must be {shape} {dtype} on {device}, got {tuple(out.shape)} {out.dtype} "
        f"on {out.device}",
    )
    require_contiguous(out, name)


def next_power_of_2(value: int) -> int:
    return int(triton.next_power_of_2(max(1, value)))


def multiprocessor_count(device: torch.device) -> int:
    """SMs on a CUDA device; a small fixed number under the interpreter (only sizes grids)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 4
