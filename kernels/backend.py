"""Which implementation `hydrant.kernels.ops` runs: Triton kernels or PyTorch references.

The choice is made per call, never at import time, so one process can hold a
CPU engine and a CUDA engine, and tests can flip it without reloading modules.
Precedence, first match wins:

1. the `backend=` argument of an op;
2. the process-wide value from `set_backend()` (the CLI passes the settings here);
3. the `HYDRANT_KERNELS` environment variable, read when the op is called;
4. "auto": Triton when the tensors live on a CUDA device, the references otherwise.

Triton on CPU tensors only works under `TRITON_INTERPRET=1` (the kernel tests);
the launchers refuse it otherwise with `KernelBackendError`.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

import torch

from hydrant.kernels.errors import KernelArgumentError

Backend = Literal["auto", "reference", "triton"]
ResolvedBackend = Literal["reference", "triton"]

ENV_VAR = "HYDRANT_KERNELS"
_BACKENDS: tuple[str, ...] = get_args(Backend)
_process_backend: Backend | None = None


def _validate(value: str, source: str) -> Backend:
    name = value.strip().lower()
    if name not in _BACKENDS:
        raise KernelArgumentError(
            f"{source}={value!r} is not a kernel backend; expected one of {', '.join(_BACKENDS)}"
        )
    return name  # type: ignore[return-value]


def set_backend(backend: Backend | None) -> None:
    """Pin the backend for this process; `None` returns to the environment / auto choice."""
    global _process_backend
    _process_backend = None if backend is None else _validate(backend, "backend")


def get_backend() -> Backend:
    """The backend that applies when an op gets no `backend=` argument (before "auto")."""
    if _process_backend is not None:
        return _process_backend
    env = os.environ.get(ENV_VAR)
    if env:
        return _validate(env, ENV_VAR)
    return "auto"


def triton_interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (tests only)."""
    return os.environ.get("TRITON_INTERPRET", "").strip() not in {"", "0", "false", "False"}


def resolve_backend(backend: Backend | None, device: torch.device) -> ResolvedBackend:
    """Turn a requested backend and the tensors' device into the implementation to run."""
    chosen = get_backend() if backend is None else _validate(backend, "backend")
    if chosen == "auto":
        return "triton" if device.type == "cuda" else "reference"
    return chosen
