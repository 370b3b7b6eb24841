"""The kernel table's ops by name, for callers without an engine: tests, benches, HF models.

Every op has the signature of the table (`hydrant.kernels.table`) plus a
keyword-only `backend=` naming the row to run ("triton", "reference" or
"cpu"); without it the tensors' device picks (`backends.for_device`: Triton
on CUDA, the references elsewhere). Nothing else is consulted: no process
setting, no environment variable. An engine does not come here: it holds the
row it chose at build (`hydrant.engine.ops`). The `triton` and `reference`
rows validate arguments identically and raise `KernelArgumentError` before
any work; Triton launchers are imported on first use, so importing this
module never imports Triton.

Value contracts that are not checked (checking would synchronise the device):
slots lie in `[-1, num_blocks * block_size)`; block-table entries the context
reaches are valid block ids; positions are below the rope table's length;
`cu_seqlens_q[-1] == q.shape[0]` and each sequence's `q_len <= context_len`
(the references check the last two, on the CPU).

CUDA graphs: see `triton_backend.py` (every launcher is capturable when
prefill gets `max_seqlen_q`).

The rest of `hydrant.kernels`:

- `table`, `backends`: the row type and the table (`triton_backend`,
  `reference_backend`, `cpu/` are its rows);
- `reference`: every op in plain PyTorch (test oracle, the `reference` row);
- `kv_write`, `decode_attention`, `prefill_attention`, `rms_norm`, `rotary`,
  `activation`, `quant_matmul` (+ `matmul_config`, `quant_gemv`): a Triton
  kernel and its launcher each; imported lazily, so CPU processes never load Triton;
- `cpu/`: the CPU's C decode attention, oneDNN linears and tuned PyTorch paths;
- `arguments`, `errors`, `triton_support`: checks, errors, Triton helpers;
- `rope_cache`, `int4_layout`: the rope table and the packed INT4 layout;
- `quantization`: `quantize_model`, `QuantizedLinear`, quantized checkpoints;
- `accuracy`: metrics and synthetic weights of the quantization gates (the
  gates themselves run the engine: `hydrant.engine.accuracy`).

The folder has no `__init__.py`, like `platform/`: `kernels` is also the import
name of Hugging Face's `kernels` distribution (transformers >= 5 installs it and
imports it when a model is built), and a regular package named `kernels` at the
repository root would shadow it whenever the root is on `sys.path`.
"""

from __future__ import annotations

import torch

from hydrant.kernels.backends import BackendName, for_device, get_backend
from hydrant.kernels.errors import KernelArgumentError, KernelBackendError
from hydrant.kernels.rope_cache import build_rope_cache
from hydrant.kernels.table import KernelBackend

__all__ = [
    "BackendName",
    "KernelArgumentError",
    "KernelBackendError",
    "build_rope_cache",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "w4a16_matmul",
    "w8a16_matmul",
    "write_kv",
]


def _row(backend: BackendName | None, device: torch.device) -> KernelBackend:
    return for_device(device) if backend is None else get_backend(backend)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    backend: BackendName | None = None,
) -> None:
    """Store K/V `[T, Hkv, D]` at `slot = block * block_size + offset`; slot -1 is skipped.

    Int8 caches (with float32 `[num_blocks, block_size, Hkv]` scales) are
    quantized symmetric per token per head, `scale = amax / 127`.
    """
    row = _row(backend, key.device)
    row.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


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
    backend: BackendName | None = None,
) -> torch.Tensor:
    """One query `[B, H, D]` per sequence over its `context_lens[b]` cached tokens (GQA)."""
    return _row(backend, q.device).paged_decode_attention(
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
    backend: BackendName | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's last `q_len` positions over its whole cached context.

    The chunk's own K/V must already be written (`write_kv` first).
    `max_seqlen_q` spares the Triton path a device sync when the caller knows it.
    """
    return _row(backend, q.device).paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        scale,
        max_seqlen_q,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    backend: BackendName | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(normed, new_residual)`: new_residual is `x + residual`, or `x` itself without one."""
    return _row(backend, x.device).rms_norm(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    backend: BackendName | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated `(q, k)` as new tensors; table rows are `cat(cos, sin)` (`build_rope_cache`)."""
    return _row(backend, q.device).rotary_embedding(positions, q, k, cos_sin_cache)


def silu_and_mul(x: torch.Tensor, *, backend: BackendName | None = None) -> torch.Tensor:
    """`silu(x[..., :I]) * x[..., I:]` for `x[..., 2I]`."""
    return _row(backend, x.device).silu_and_mul(x)


def w8a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    *,
    backend: BackendName | None = None,
) -> torch.Tensor:
    """`x[M, K] @ (qweight[N, K] * scales[N, None]).T` -> `[M, N]` in x's dtype."""
    return _row(backend, x.device).w8a16_matmul(x, qweight, scales)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    *,
    backend: BackendName | None = None,
) -> torch.Tensor:
    """`x[M, K] @ dequant(W).T`, `W[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g]`, g = k // group.

    `qweight` is `uint8[N, K // 2]`: low nibble = even k, high nibble = odd k
    (`hydrant.kernels.int4_layout` documents the layout and packs it).
    """
    return _row(backend, x.device).w4a16_matmul(x, qweight, scales, zeros, group_size)
