"""The PyTorch references against naive dense computations and transformers' own code.

The Triton kernels are only as trustworthy as the reference they are compared
to, so each reference is checked here against something written differently:
SDPA over K/V gathered token by token, a dense matmul of the dequantized
weight, and transformers' Llama RMSNorm / rotary implementation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import gathered, make_paged_kv, rel_error
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from hydrant.kernels import reference
from hydrant.kernels.int4_layout import dequantize_int4, pack_int4, unpack_int4
from hydrant.kernels.rope_cache import build_rope_cache


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q `[Lq, H, D]` = last Lq positions; k/v `[Lk, Hkv, D]`; GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1).transpose(0, 1)
    vv = v.repeat_interleave(group, dim=1).transpose(0, 1)
    lq, lk = q.shape[0], k.shape[0]
    mask = torch.arange(lk)[None, :] <= (torch.arange(lq)[:, None] + lk - lq)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (8, 1)])
def test_prefill_reference_matches_sdpa(
    gen: torch.Generator, heads: int, kv_heads: int, int8: bool
) -> None:
    lens, q_lens = [1, 8, 9, 23], [1, 8, 4, 11]
    kv = make_paged_kv(lens, kv_heads, 64, 8, torch.float32, gen, int8=int8)
    q = torch.randn(sum(q_lens), heads, 64, generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    out = reference.paged_prefill_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 0.125, **kv.scales
    )
    for b in range(len(lens)):
        expected = sdpa_causal(
            q[cu[b] : cu[b + 1]], gathered(kv, b, "k"), gathered(kv, b, "v"), 0.125
        )
        assert rel_error(out[cu[b] : cu[b + 1]], expected) < 1e-5


def test_decode_reference_matches_sdpa(gen: torch.Generator) -> None:
    lens = [1, 16, 17, 5]
    kv = make_paged_kv(lens, 2, 128, 16, torch.float32, gen)
    q = torch.randn(len(lens), 8, 128, generator=gen)
    out = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.09
    )
    for b in range(len(lens)):
        expected = sdpa_causal(q[b : b + 1], gathered(kv, b, "k"), gathered(kv, b, "v"), 0.09)
        assert rel_error(out[b : b + 1], expected) < 1e-5


def test_prefill_reference_rejects_more_queries_than_context(gen: torch.Generator) -> None:
    kv = make_paged_kv([3], 1, 64, 4, torch.float32, gen)
    q = torch.randn(4, 1, 64, generator=gen)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="q_len <= context_len"):
        reference.paged_prefill_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 1.0
        )


def test_write_kv_reference_places_tokens_and_skips_padding(gen: torch.Generator) -> None:
    key = torch.randn(4, 2, 8, generator=gen)
    value = torch.randn(4, 2, 8, generator=gen)
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    reference.write_kv(key, value, k_cache, v_cache, torch.tensor([5, -1, 0, 11]))
    assert torch.equal(k_cache[1, 1], key[0]) and torch.equal(v_cache[1, 1], value[0])
    assert torch.equal(k_cache[0, 0], key[2]) and torch.equal(k_cache[2, 3], key[3])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 3  # the -1 token wrote nothing


def test_int8_kv_quantization_error_is_within_half_a_step(gen: torch.Generator) -> None:
    x = torch.randn(64, 4, 128, generator=gen) * 3
    x[0, 0] = 0.0
    codes, scales = reference.quantize_kv_int8(x)
    assert codes.dtype == torch.int8 and scales.shape == (64, 4)
    assert float(scales[0, 0]) == 0.0 and not codes[0, 0].any()
    error = (codes.float() * scales[..., None] - x).abs()
    assert bool((error <= scales[..., None] / 2 + 1e-6).all())
    assert int(codes.abs().max()) == 127


def test_rms_norm_reference_matches_transformers(gen: torch.Generator) -> None:
    hf = LlamaRMSNorm(96, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(96, generator=gen))
    x = torch.randn(5, 96, generator=gen)
    residual = torch.randn(5, 96, generator=gen)
    normed, new_residual = reference.rms_norm(x, hf.weight, 1e-6, residual)
    assert torch.equal(new_residual, x + residual)
    assert rel_error(normed, hf(x + residual)) < 1e-6
    normed, same = reference.rms_norm(x, hf.weight, 1e-6)
    assert same is x and rel_error(normed, hf(x)) < 1e-6


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 500000.0,
        },
    ],
)
def test_rope_cache_and_rotary_reference_match_transformers(
    gen: torch.Generator, rope_parameters: dict[str, float | str]
) -> None:
    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_parameters=rope_parameters,
    )
    positions = torch.tensor([0, 1, 7, 63, 64, 200, 511])
    q = torch.randn(7, 4, 64, generator=gen)
    k = torch.randn(7, 2, 64, generator=gen)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    scaling = None if rope_parameters["rope_type"] == "default" else dict(rope_parameters)
    theta = float(rope_parameters["rope_theta"])
    table = build_rope_cache(64, 512, theta, scaling, torch.float32, "cpu")
    out_q, out_k = reference.rotary_embedding(positions, q, k, table)
    assert rel_error(out_q, hf_q[0].transpose(0, 1)) < 1e-5
    assert rel_error(out_k, hf_k[0].transpose(0, 1)) < 1e-5


def test_silu_and_mul_reference(gen: torch.Generator) -> None:
    x = torch.randn(3, 2, 40, generator=gen)
    assert rel_error(reference.silu_and_mul(x), F.silu(x[..., :20]) * x[..., 20:]) < 1e-6


def test_int4_pack_layout_low_nibble_is_even_column() -> None:
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(unpack_int4(packed), codes)


def test_quant_matmul_references_match_dense(gen: torch.Generator) -> None:
    x = torch.randn(5, 256, generator=gen)
    q8 = torch.randint(-127, 128, (48, 256), generator=gen, dtype=torch.int8)
    s8 = torch.rand(48, generator=gen)
    expected = x @ (q8.float() * s8[:, None]).t()
    assert rel_error(reference.w8a16_matmul(x, q8, s8), expected) < 1e-6
    codes = torch.randint(0, 16, (48, 256), generator=gen, dtype=torch.uint8)
    scales = torch.rand(48, 2, generator=gen)
    zeros = torch.randint(0, 16, (48, 2), generator=gen).float()
    weight = (codes.float() - zeros.repeat_interleave(128, 1)) * scales.repeat_interleave(128, 1)
    assert torch.equal(dequantize_int4(pack_int4(codes), scales, zeros, 128), weight)
    out = reference.w4a16_matmul(x, pack_int4(codes), scales, zeros, 128)
    assert rel_error(out, x @ weight.t()) < 1e-6
