"""The one dispatch point the engine calls: Triton kernels on CUDA, PyTorch references on CPU.

Every op has the signature agreed with the engine (`engine/attention.py`,
`engine/layers.py` implement the same ones in torch), plus a keyword-only
`backend=` override; see `hydrant.kernels.backend` for how the backend is
chosen. Both paths validate arguments identically and raise
`KernelArgumentError` before any work. Triton launchers are imported on first
use, so importing this module never imports Triton.

Value contracts that are not checked (checking would synchronise the device):
slots lie in `[-1, num_blocks * block_size)`; block-table entries the context
reaches are valid block ids; positions are below the rope table's length;
`cu_seqlens_q[-1] == q.shape[0]` and each sequence's `q_len <= context_len`
(the references check the last two, on the CPU).

CUDA graphs: every Triton launcher is capturable (no host sync, allocations
come from the caching allocator) provided prefill gets `max_seqlen_q`; the
decode split count depends only on shapes, so one graph per decode batch
size and block-table width replays correctly for any context lengths.

The rest of `hydrant.kernels` is implementation, reached through here:

- `reference`: every op in plain PyTorch (CPU path, test oracle);
- `kv_write`, `decode_attention`, `prefill_attention`, `rms_norm`, `rotary`,
  `activation`, `quant_matmul` (+ `matmul_config`): a Triton kernel and its
  launcher each; imported lazily, so CPU processes never load Triton;
- `arguments`, `errors`, `backend`, `triton_support`: checks, errors, backend choice;
- `rope_cache`, `int4_layout`: the rope table and the packed INT4 layout;
- `quantization`: `quantize_model`, `QuantizedLinear`, quantized checkpoints;
- `accuracy`: the quantization accuracy gates (tests and `bench/quant_accuracy.py`).

The folder has no `__init__.py`, like `platform/`: `kernels` is also the import
name of Hugging Face's `kernels` distribution (transformers >= 5 installs it and
imports it when a model is built), and a regular package named `kernels` at the
repository root would shadow it whenever the root is on `sys.path`.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

from hydrant.kernels import arguments, reference
from hydrant.kernels.backend import Backend, get_backend, resolve_backend, set_backend
from hydrant.kernels.errors import KernelArgumentError, KernelBackendError
from hydrant.kernels.rope_cache import build_rope_cache

__all__ = [
    "Backend",
    "KernelArgumentError",
    "KernelBackendError",
    "build_rope_cache",
    "get_backend",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rotary_embedding",
    "set_backend",
    "silu_and_mul",
    "w4a16_matmul",
    "w8a16_matmul",
    "write_kv",
]


def _launcher(module: str, device: torch.device, backend: Backend | None) -> Any | None:
    """The Triton launcher function named like the op, or None for the reference path."""
    if resolve_backend(backend, device) == "reference":
        return None
    try:
        loaded: ModuleType = importlib.import_module(f"hydrant.kernels.{module}")
    except ImportError as exc:
        raise KernelBackendError(f"the Triton backend is unavailable: {exc}") from exc
    return loaded


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    backend: Backend | None = None,
) -> None:
    """Store K/V `[T, Hkv, D]` at `slot = block * block_size + offset`; slot -1 is skipped.

    Int8 caches (with float32 `[num_blocks, block_size, Hkv]` scales) are
    quantized symmetric per token per head, `scale = amax / 127`.
    """
    mod = _launcher("kv_write", key.device, backend)
    if mod is not None:
        mod.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return
    arguments.check_write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    reference.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """One query `[B, H, D]` per sequence over its `context_lens[b]` cached tokens (GQA)."""
    mod = _launcher("decode_attention", q.device, backend)
    if mod is not None:
        result: torch.Tensor = mod.paged_decode_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
        )
        return result
    arguments.check_attention(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale)
    return reference.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, k_scale=k_scale, v_scale=v_scale
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_seqlen_q: int | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's last `q_len` positions over its whole cached context.

    The chunk's own K/V must already be written (`write_kv` first).
    `max_seqlen_q` spares the Triton path a device sync when the caller knows it.
    """
    mod = _launcher("prefill_attention", q.device, backend)
    if mod is not None:
        result: torch.Tensor = mod.paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            cu_seqlens_q,
            context_lens,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
            max_seqlen_q=max_seqlen_q,
        )
        return result
    arguments.check_attention(
        q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, cu_seqlens_q
    )
    return reference.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    backend: Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(normed, new_residual)`: new_residual is `x + residual`, or `x` itself without one."""
    mod = _launcher("rms_norm", x.device, backend)
    if mod is not None:
        normed: tuple[torch.Tensor, torch.Tensor] = mod.rms_norm(x, weight, eps, residual)
        return normed
    arguments.check_rms_norm(x, weight, residual)
    return reference.rms_norm(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    backend: Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated `(q, k)` as new tensors; table rows are `cat(cos, sin)` (`build_rope_cache`)."""
    mod = _launcher("rotary", q.device, backend)
    if mod is not None:
        rotated: tuple[torch.Tensor, torch.Tensor] = mod.rotary_embedding(
            positions, q, k, cos_sin_cache
        )
        return rotated
    arguments.check_rotary(positions, q, k, cos_sin_cache)
    return reference.rotary_embedding(positions, q, k, cos_sin_cache)


def silu_and_mul(x: torch.Tensor, *, backend: Backend | None = None) -> torch.Tensor:
    """`silu(x[..., :I]) * x[..., I:]` for `x[..., 2I]`."""
    mod = _launcher("activation", x.device, backend)
    if mod is not None:
        out: torch.Tensor = mod.silu_and_mul(x)
        return out
    arguments.check_silu_and_mul(x)
    return reference.silu_and_mul(x)


def w8a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    *,
    backend: Backend | None = None,
) -> torch.Tensor:
    """`x[M, K] @ (qweight[N, K] * scales[N, None]).T` -> `[M, N]` in x's dtype."""
    mod = _launcher("quant_matmul", x.device, backend)
    if mod is not None:
        out: torch.Tensor = mod.w8a16_matmul(x, qweight, scales)
        return out
    arguments.check_w8a16(x, qweight, scales)
    return reference.w8a16_matmul(x, qweight, scales)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    *,
    backend: Backend | None = None,
) -> torch.Tensor:
    """`x[M, K] @ dequant(W).T`, `W[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g]`, g = k // group.

    `qweight` is `uint8[N, K // 2]`: low nibble = even k, high nibble = odd k
    (`hydrant.kernels.int4_layout` documents the layout and packs it).
    """
    mod = _launcher("quant_matmul", x.device, backend)
    if mod is not None:
        out: torch.Tensor = mod.w4a16_matmul(x, qweight, scales, zeros, group_size)
        return out
    arguments.check_w4a16(x, qweight, scales, zeros, group_size)
    return reference.w4a16_matmul(x, qweight, scales, zeros, group_size)
