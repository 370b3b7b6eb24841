"""The cpu backend's C RMSNorm, RoPE, SiLU-and-mul and K/V write against its PyTorch ops.

The C versions (native_elementwise.c) replace `elementwise.py`'s ops and
`attention.write_kv` on float32; they must give the same numbers up to the
rounding of sums, take the engine's strided views (q, k, v are views of the fused
QKV projection), run every build (AVX-512, AVX2+FMA, portable: the SiLU has a
path each), and refuse what would read or write outside their tensors.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest
import torch
from kernel_testing import rel_error

from hydrant.kernels.cpu import attention, elementwise, native_elementwise
from hydrant.kernels.errors import KernelArgumentError

pytestmark = pytest.mark.skipif(
    not native_elementwise.available() and os.environ.get("CI") != "true",
    reason="no C compiler here (in CI the kernels must build)",
)


@pytest.fixture()
def build(
    native_build: ctypes.CDLL | None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ctypes.CDLL]:
    """The module's functions running on one build (the engine's, or a lesser CPU's)."""
    library = native_elementwise._native() if native_build is None else native_build
    assert library is not None
    declared = native_elementwise.declare(library)
    monkeypatch.setattr(native_elementwise, "_native", lambda: declared)
    native_elementwise._silu_max_floats.cache_clear()
    yield declared
    native_elementwise._silu_max_floats.cache_clear()


def _fused_qkv(tokens: int, heads: int, kv_heads: int, head_dim: int, seed: int) -> tuple:
    """q, k, v as the engine makes them: views of one [tokens, (H + 2 Hkv) * D] projection."""
    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=gen)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return (
        q.view(tokens, heads, head_dim),
        k.view(tokens, kv_heads, head_dim),
        v.view(tokens, kv_heads, head_dim),
    )


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("hidden", [128, 200, 37])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_pytorch(
    build: ctypes.CDLL, rows: int, hidden: int, with_residual: bool
) -> None:
    gen = torch.Generator().manual_seed(rows * hidden)
    wide = torch.randn(rows, hidden + 5, generator=gen) * 3
    x = wide[:, 2 : 2 + hidden]  # rows with a stride, as a view of a wider tensor
    weight = torch.randn(hidden, generator=gen)
    residual = torch.randn(rows, hidden, generator=gen) if with_residual else None
    normed, total = native_elementwise.rms_norm(x, weight, 1e-5, residual)
    ref_normed, ref_total = elementwise.rms_norm(x, weight, 1e-5, residual)
    assert rel_error(normed, ref_normed) < 1e-6
    if residual is None:
        assert total is x  # the stream is the input itself, as in PyTorch's op
    else:
        assert torch.equal(total, ref_total)  # one rounding, the same in both
    assert normed.is_contiguous()


def test_rms_norm_splits_large_calls_over_threads(build: ctypes.CDLL) -> None:
    x, residual = torch.randn(2, 600, 300).unbind(0)  # over the one-thread size
    weight = torch.randn(300)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        normed, total = native_elementwise.rms_norm(x, weight, 1e-6, residual)
    finally:
        torch.set_num_threads(previous)
    ref_normed, ref_total = elementwise.rms_norm(x, weight, 1e-6, residual)
    assert rel_error(normed, ref_normed) < 1e-6 and torch.equal(total, ref_total)


@pytest.mark.parametrize(
    ("tokens", "heads", "kv_heads", "head_dim"),
    [(1, 4, 2, 32), (9, 8, 2, 64), (5, 16, 4, 128), (3, 4, 4, 80), (400, 8, 2, 64)],
)
def test_rope_matches_pytorch_on_the_engines_views(
    build: ctypes.CDLL, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    from hydrant.kernels.rope_cache import build_rope_cache

    q, k, _ = _fused_qkv(tokens, heads, kv_heads, head_dim, seed=tokens)
    table = build_rope_cache(head_dim, 512, 10000.0, None, torch.float32, "cpu")
    positions = torch.randint(0, 512, (tokens,), generator=torch.Generator().manual_seed(3))
    positions[0] = 511  # the table's last row
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # the largest case crosses the one-thread size
    try:
        q_out, k_out = native_elementwise.rotary_embedding(positions, q, k, table)
    finally:
        torch.set_num_threads(previous)
    ref_q, ref_k = elementwise.rotary_embedding(positions, q, k, table)
    assert rel_error(q_out, ref_q) < 1e-6 and rel_error(k_out, ref_k) < 1e-6
    assert q_out.is_contiguous() and k_out.is_contiguous()


def test_rope_refuses_a_position_past_the_table(build: ctypes.CDLL) -> None:
    from hydrant.kernels.rope_cache import build_rope_cache

    q, k, _ = _fused_qkv(2, 4, 2, 32, seed=1)
    table = build_rope_cache(32, 16, 10000.0, None, torch.float32, "cpu")
    with pytest.raises(KernelArgumentError, match="16 positions"):
        native_elementwise.rotary_embedding(torch.tensor([3, 16]), q, k, table)
    with pytest.raises(KernelArgumentError):
        native_elementwise.rotary_embedding(torch.tensor([-1, 0]), q, k, table)


@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("inter", [352, 1100, 37])
def test_silu_and_mul_matches_pytorch(build: ctypes.CDLL, rows: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    x = torch.randn(rows, 2 * inter, generator=gen) * 4
    x[0, :4] = torch.tensor([100.0, -100.0, 90.0, -90.0])  # past the exp's clamp both ways
    assert rel_error(native_elementwise.silu_and_mul(x), elementwise.silu_and_mul(x)) < 1e-6


def test_silu_and_mul_splits_large_calls_over_threads(build: ctypes.CDLL) -> None:
    x = torch.randn(300, 2 * 1100) * 4  # prefill-sized: over the one-thread size
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = native_elementwise.silu_and_mul(x)
    finally:
        torch.set_num_threads(previous)
    want = elementwise.silu_and_mul(x)
    if build.hydrant_silu_lanes():
        assert rel_error(got, want) < 1e-6
    else:  # libm's exp per element: large calls are PyTorch's own
        assert torch.equal(got, want)


def test_silu_computes_in_vector_lanes_where_the_build_has_them(
    build: ctypes.CDLL, request: pytest.FixtureRequest
) -> None:
    from hydrant.kernels.cpu import native_decode

    which = request.node.callspec.params["native_build"]
    flags = set(native_decode._cpu_flags().split())
    avx2 = {"avx2", "fma"} <= flags
    expected = {
        "native": 16 if "avx512f" in flags else 8 if avx2 else 0,
        "avx2": 8,
        "portable": 0,
    }[which]
    assert build.hydrant_silu_lanes() == expected


@pytest.mark.parametrize("tokens", [1, 6, 300])
def test_write_kv_matches_pytorch_and_skips_padding(build: ctypes.CDLL, tokens: int) -> None:
    _, k, v = _fused_qkv(tokens, 4, 2, 32, seed=tokens)
    k = k.contiguous()  # as RoPE hands it on; v stays the projection's view
    k_cache = torch.randn(40, 16, 2, 32)
    v_cache = torch.randn(40, 16, 2, 32)
    slots = torch.randperm(40 * 16, generator=torch.Generator().manual_seed(0))[:tokens]
    if tokens > 1:
        slots[1] = -1  # padding: skipped
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    attention.write_kv(k, v, ref_k, ref_v, slots)
    native_elementwise.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_write_kv_refuses_a_slot_past_the_cache_and_writes_nothing(build: ctypes.CDLL) -> None:
    _, k, v = _fused_qkv(3, 4, 2, 32, seed=2)
    k_cache, v_cache = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    with pytest.raises(KernelArgumentError, match="64 slots"):
        native_elementwise.write_kv(k, v, k_cache, v_cache, torch.tensor([0, 5, 64]))
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_dtypes_take_the_pytorch_ops(dtype: torch.dtype) -> None:
    from hydrant.kernels.rope_cache import build_rope_cache

    q, k, v = (t.to(dtype) for t in _fused_qkv(3, 4, 2, 32, seed=4))
    x = torch.randn(3, 64).to(dtype)
    weight = torch.randn(64).to(dtype)
    assert torch.equal(
        native_elementwise.rms_norm(x, weight, 1e-5, x)[0],
        elementwise.rms_norm(x, weight, 1e-5, x)[0],
    )
    table = build_rope_cache(32, 16, 10000.0, None, torch.float32, "cpu")
    positions = torch.tensor([0, 5, 9])
    for ours, theirs in zip(
        native_elementwise.rotary_embedding(positions, q, k, table),
        elementwise.rotary_embedding(positions, q, k, table),
        strict=True,
    ):
        assert torch.equal(ours, theirs)
    gate_up = torch.randn(3, 128).to(dtype)
    assert torch.equal(native_elementwise.silu_and_mul(gate_up), elementwise.silu_and_mul(gate_up))
    caches = [torch.zeros(4, 16, 2, 32, dtype=dtype) for _ in range(4)]
    native_elementwise.write_kv(k, v, caches[0], caches[1], positions)
    attention.write_kv(k, v, caches[2], caches[3], positions)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
