"""RMSNorm (+ residual), rotary embedding and SiLU-and-mul kernels against the reference.

Outputs are handed in NaN-filled so an element the kernel skips fails; q/k
arrive as strided views of a fused QKV tensor, as the engine will pass them.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import REL_TOL, rel_error

pytest.importorskip("triton")

from hydrant.kernels import activation, ops, reference, rms_norm, rotary
from hydrant.kernels.rope_cache import build_rope_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full(t.shape, float("nan"), dtype=t.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_kernel(gen: torch.Generator, dtype: torch.dtype, with_residual: bool) -> None:
    x = torch.randn(7, 200, generator=gen).to(dtype)
    weight = torch.randn(200, generator=gen).to(dtype)
    residual = torch.randn(7, 200, generator=gen).to(dtype) if with_residual else None
    out, res_out = nan_like(x), nan_like(x)
    normed, new_res = rms_norm.rms_norm(x, weight, 1e-5, residual, out=out, residual_out=res_out)
    ref_normed, ref_res = reference.rms_norm(x, weight, 1e-5, residual)
    assert normed is out and rel_error(normed, ref_normed) < REL_TOL[dtype]
    if with_residual:
        assert new_res is res_out and rel_error(new_res, ref_res) < REL_TOL[dtype]
    else:
        assert new_res is x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "rot"), [(4, 4, 64, 64), (8, 1, 128, 128), (4, 2, 64, 32)]
)
def test_rotary_kernel(
    gen: torch.Generator, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, rot: int
) -> None:
    table = build_rope_cache(rot, 300, 500000.0, LLAMA3, dtype, "cpu")
    fused = torch.randn(6, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    q, k = fused[:, :heads], fused[:, heads : heads + kv_heads]
    positions = torch.tensor([0, 1, 31, 32, 299, 7])
    q_out, k_out = nan_like(q), nan_like(k)
    rotary.rotary_embedding(positions, q, k, table, q_out=q_out, k_out=k_out)
    ref_q, ref_k = reference.rotary_embedding(positions, q, k, table)
    assert rel_error(q_out, ref_q) < REL_TOL[dtype]
    assert rel_error(k_out, ref_k) < REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_kernel(gen: torch.Generator, dtype: torch.dtype) -> None:
    x = torch.randn(3, 2, 2 * 1100, generator=gen).to(dtype)  # two column blocks, ragged
    out = torch.full((3, 2, 1100), float("nan"), dtype=dtype)
    activation.silu_and_mul(x, out=out)
    assert rel_error(out, reference.silu_and_mul(x)) < REL_TOL[dtype]
    assert rel_error(ops.silu_and_mul(x, backend="triton"), reference.silu_and_mul(x)) < 2e-2
