"""The one kernel-backend table: every implementation of the model's ops, by name.

- `triton`: the Triton kernels (CUDA; the CPU only under the interpreter, for
  tests). Features: kv_int8, graph_capture.
- `reference`: the PyTorch references, arguments checked: the ground truth
  every kernel test compares with. Features: kv_int8.
- `cpu`: C decode attention, oneDNN linears, PyTorch prefill and elementwise
  ops tuned for the CPU. Features: kv_int8 and, in float32 with the C kernel
  built, fast_linears; otherwise planned_decode (`cpu/backend.py`).

A caller picks a row once and calls its ops (`hydrant.kernels.table` says
what a row holds). The engine does so at build, from `EngineConfig.kernels`
(`hydrant.engine.ops`); code without an engine (a quantized transformers
model, the benches) takes `for_device`: Triton on CUDA, the references
elsewhere. Nothing here reads the environment or keeps a process-wide choice.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from hydrant.kernels.cpu.backend import cpu_backend
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.table import KernelBackend
from hydrant.kernels.triton_backend import TRITON

BackendName = Literal["triton", "reference", "cpu"]
BACKEND_NAMES: tuple[BackendName, ...] = get_args(BackendName)


def get_backend(name: str, dtype: torch.dtype = torch.float32) -> KernelBackend:
    """The row called `name`; for "cpu", its variant for a model computing in `dtype`."""
    if name == "triton":
        return TRITON
    if name == "reference":
        return REFERENCE
    if name == "cpu":
        return cpu_backend(dtype)
    raise KernelArgumentError(
        f"{name!r} is not a kernel backend; expected one of {', '.join(BACKEND_NAMES)}"
    )


def for_device(device: torch.device) -> KernelBackend:
    """The row for callers without an engine: Triton on CUDA, the references elsewhere."""
    return TRITON if device.type == "cuda" else REFERENCE
