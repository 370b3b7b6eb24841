"""Which row of the kernel table (`hydrant.kernels.backends`) an engine runs: chosen once, at build.

`EngineConfig.kernels` names it:

- "auto" (the default): `triton` on CUDA; on the CPU the `cpu` backend (C
  decode attention and oneDNN linears in float32, falling back to its PyTorch
  planned decode, logged once, when the C kernel cannot be built);
- "cpu": the same on the CPU, but it insists on the C kernel;
- "reference": the PyTorch references on any device (slow, the ground truth);
- "triton": the Triton kernels (CUDA; on the CPU only under `TRITON_INTERPRET=1`,
  which is how the tests run them through the engine).

The names of before the table still work: "torch" (the pure PyTorch path) is
"reference", "native" (which insisted on the C kernel) is "cpu", and
"hydrant" (the kernel package's own choice) is "triton" on CUDA and
"reference" elsewhere. The model then calls the chosen row's ops, the int8
KV cache and planned decode included (features the row declares); nothing
chooses again per call.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.kernels.backends import get_backend
from hydrant.kernels.cpu.backend import cpu_backend
from hydrant.kernels.errors import KernelBackendError
from hydrant.kernels.quantization import QuantizedLinear
from hydrant.kernels.table import KernelBackend
from hydrant.kernels.triton_backend import triton_interpreter_enabled

if TYPE_CHECKING:
    from hydrant.engine.model import LlamaForCausalLM

LEGACY_NAMES = {"torch": "reference", "native": "cpu"}  # "hydrant" depends on the device


def select_backend(config: EngineConfig, dtype: torch.dtype) -> KernelBackend:
    """The row `config.kernels` names for `config.device` and a model computing in `dtype`;
    `EngineConfigError` when it cannot run there or lacks a feature the config asks for."""
    device = torch.device(config.device)
    choice = config.kernels
    name = LEGACY_NAMES.get(choice, choice)
    if name == "hydrant":
        name = "triton" if device.type == "cuda" else "reference"
    if name == "auto":
        backend = get_backend("triton" if device.type == "cuda" else "cpu", dtype)
    elif name == "cpu":
        if device.type != "cpu":
            raise EngineConfigError(f"kernels={choice!r} runs on the CPU, not on {device}")
        try:
            backend = cpu_backend(dtype, require_native=True)
        except KernelBackendError as exc:
            raise EngineConfigError(f"kernels={choice!r}: {exc}") from exc
    elif name == "triton":
        _check_triton(device)
        backend = get_backend(name)
    else:
        backend = get_backend(name, dtype)
    if config.kv_cache_dtype == "int8" and not backend.has("kv_int8"):
        raise EngineConfigError(f"the {backend.name} kernels have no int8 KV cache")
    return backend


def _check_triton(device: torch.device) -> None:
    if importlib.util.find_spec("triton") is None:
        raise EngineConfigError("kernels='triton' needs the triton package")
    if device.type != "cuda" and not (device.type == "cpu" and triton_interpreter_enabled()):
        raise EngineConfigError(
            f"kernels='triton' needs a CUDA device, not {device} (the CPU only runs Triton "
            "under TRITON_INTERPRET=1, for tests)"
        )


def bind_linears(model: LlamaForCausalLM, backend: KernelBackend) -> None:
    """After loading (and quantizing): quantized linears run the backend's W8A16/W4A16, and
    a `fast_linears` backend takes over the float linears and the LM head's matmul."""
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.backend = backend
    if backend.optimize_linears is not None:
        backend.optimize_linears(model)
    if backend.linear_for is not None and not model.config.embedding_only:
        model.head_linear = backend.linear_for(model.head_weight())
