"""The cpu backend's C decode attention and oneDNN linears against float64 / F.linear references.

The kernel is built for real with the machine's C compiler (the same build
the engine does); the reference is the cpu backend's PyTorch decode path run in
float64, so any indexing, masking or softmax error shows up as a large
relative error, and rounding alone stays near 1e-7. The decode comparisons
also run on builds with x86 features switched off, so an AVX-512 host checks
the AVX2+FMA paths (EPYCs before Zen 4) and the portable loops as well.
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import rel_error
from torch import nn

from hydrant.kernels.cpu import native_decode
from hydrant.kernels.cpu.attention import paged_decode_attention, paged_prefill_attention
from hydrant.kernels.cpu.linear import (
    PACK_ROWS_HINT,
    OneDnnLinear,
    onednn_available,
    onednn_linear,
    pack_weight,
    packing_available,
    use_onednn_linears,
)

requires_native = pytest.mark.skipif(
    not native_decode.available() and os.environ.get("CI") != "true",
    reason="no C compiler here (in CI the kernel must build)",
)


def _case(
    lens: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """K/V caches with every sequence's blocks shuffled over the pool, garbage in unused slots."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    pool = sum(need) + 5
    k_cache = torch.randn(pool, block_size, kv_heads, head_dim, generator=gen) * 50
    v_cache = torch.randn(pool, block_size, kv_heads, head_dim, generator=gen) * 50
    order = torch.randperm(pool, generator=gen).tolist()
    width = max(need) + 2  # wider than any sequence needs, like the runner's padded tables
    tables = torch.full((len(lens), width), pool - 1, dtype=torch.int32)
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    # the slots sequences own hold sane values; the garbage (x50) elsewhere must never be read
    for i, length in enumerate(lens):
        for p in range(length):
            block, offset = int(tables[i, p // block_size]), p % block_size
            k_cache[block, offset] = torch.randn(kv_heads, head_dim, generator=gen)
            v_cache[block, offset] = torch.randn(kv_heads, head_dim, generator=gen)
    q = torch.randn(len(lens), heads, head_dim, generator=gen)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@requires_native
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    # SIMD head sizes 32/64/128 with groups of 1 to 8 (every V tiling; 3 KV heads: AVX-512
    # tiles pairs of them, one left over), then portable sizes
    [
        (4, 2, 32),
        (6, 3, 32),
        (8, 1, 32),
        (4, 4, 64),
        (8, 2, 64),
        (16, 2, 128),
        (4, 4, 128),
        (6, 2, 80),
        (3, 1, 16),
    ],
)
@pytest.mark.parametrize("block_size", [16, 5])
def test_native_decode_matches_float64_reference(
    heads: int, kv_heads: int, head_dim: int, block_size: int, native_build: ctypes.CDLL | None
) -> None:
    lens = [1, block_size, block_size + 1, 2 * block_size - 1, 37, 300, 3]
    q, k, v, tables, ctx = _case(lens, heads, kv_heads, head_dim, block_size, seed=heads)
    for scale in (head_dim**-0.5, 1.0):  # 1.0: peaked softmax, large exponents
        ref = paged_decode_attention(q.double(), k.double(), v.double(), tables, ctx, scale)
        out = native_decode.paged_decode_attention(q, k, v, tables, ctx, scale, native_build)
        assert out.dtype == torch.float32 and out.shape == q.shape
        assert rel_error(out, ref) < 1e-5, f"scale {scale}"
        for i in range(len(lens)):  # each sequence on its own, not just the batch norm
            assert rel_error(out[i], ref[i]) < 1e-5, f"sequence {i} (len {lens[i]})"


@requires_native
def test_native_decode_does_not_depend_on_the_batch(native_build: ctypes.CDLL | None) -> None:
    """A sequence's output is the same alone and in a batch: batching never changes a token."""
    lens = [5, 64, 200, 17]
    q, k, v, tables, ctx = _case(lens, 8, 2, 64, 16, seed=7)
    batched = native_decode.paged_decode_attention(q, k, v, tables, ctx, 0.125, native_build)
    for i in range(len(lens)):
        alone = native_decode.paged_decode_attention(
            q[i : i + 1], k, v, tables[i : i + 1].contiguous(), ctx[i : i + 1], 0.125, native_build
        )
        assert torch.equal(alone[0], batched[i])


def _prefill_case(
    contexts: list[int], q_lens: list[int], heads: int, kv_heads: int, head_dim: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """A prefill batch: sequence i has `contexts[i]` tokens cached, the last `q_lens[i]` of
    them its new positions (q_len < context: a later chunk or a prefix-cache hit)."""
    _, k, v, tables, ctx = _case(contexts, heads, kv_heads, head_dim, 16, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), heads, head_dim, generator=gen)
    return q, k, v, tables, cu, ctx


@requires_native
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 32), (8, 2, 64), (6, 2, 80)])
def test_native_prefill_matches_float64_reference(
    heads: int, kv_heads: int, head_dim: int, native_build: ctypes.CDLL | None
) -> None:
    """Short prompts run as rows of the C kernel, long ones (over ROWS_MAX_CONTEXT) as SDPA,
    in one batch, whole prompts and later chunks alike, and a sequence with no new rows."""
    limit = native_decode.ROWS_MAX_CONTEXT
    contexts = [1, 17, 300, limit, limit + 1, 40, 700, 9]
    q_lens = [1, 17, 120, limit, 200, 0, 700, 9]
    q, k, v, tables, cu, ctx = _prefill_case(contexts, q_lens, heads, kv_heads, head_dim, heads)
    scale = head_dim**-0.5
    ref = paged_prefill_attention(q.double(), k.double(), v.double(), tables, cu, ctx, scale)
    out = native_decode.paged_prefill_attention(q, k, v, tables, cu, ctx, scale, native_build)
    assert out.dtype == torch.float32 and out.shape == q.shape
    starts = cu.tolist()
    for i in range(len(contexts)):  # each sequence on its own, not just the batch norm
        part = slice(starts[i], starts[i + 1])
        if starts[i + 1] > starts[i]:
            assert rel_error(out[part], ref[part]) < 1e-5, f"sequence {i}"


@requires_native
def test_native_prefill_of_short_prompts_only_and_long_only() -> None:
    """The two uniform batches take one path each; both still match."""
    for contexts in ([5, 64, 256], [600, 1030]):
        q, k, v, tables, cu, ctx = _prefill_case(contexts, contexts, 4, 2, 32, seed=len(contexts))
        ref = paged_prefill_attention(q.double(), k.double(), v.double(), tables, cu, ctx, 0.2)
        out = native_decode.paged_prefill_attention(q, k, v, tables, cu, ctx, 0.2)
        assert rel_error(out, ref) < 1e-5, contexts


@requires_native
def test_native_prefill_takes_int64_indices_and_refuses_a_context_past_its_table() -> None:
    """The step's tensors may come as int64; a context longer than its block table (a
    broken scheduler invariant) is a clear error, not a read past the table."""
    q, k, v, tables, cu, ctx = _prefill_case([30, 7], [12, 7], 4, 2, 32, seed=5)
    ref = paged_prefill_attention(q.double(), k.double(), v.double(), tables, cu, ctx, 0.2)
    out = native_decode.paged_prefill_attention(q, k, v, tables, cu.long(), ctx.long(), 0.2)
    assert rel_error(out, ref) < 1e-5
    too_long = ctx.clone()
    too_long[1] = tables.shape[1] * k.shape[1] + 1
    with pytest.raises(ValueError, match="longer than its block table"):
        native_decode.paged_prefill_attention(q, k, v, tables, cu, too_long, 0.2)


@requires_native
def test_native_decode_refuses_a_context_past_its_table() -> None:
    q, k, v, tables, ctx = _case([9, 20], 4, 2, 32, 8, seed=4)
    too_long = ctx.clone()
    too_long[0] = tables.shape[1] * k.shape[1] + 1
    with pytest.raises(ValueError, match="longer than its block table"):
        native_decode.paged_decode_attention(q, k, v, tables, too_long, 0.2)
    ref = paged_decode_attention(q.double(), k.double(), v.double(), tables, ctx, 0.2)
    assert rel_error(native_decode.paged_decode_attention(q, k, v, tables, ctx, 0.2), ref) < 1e-5


def test_unsupported_inputs_take_the_torch_path() -> None:
    q, k, v, tables, ctx = _case([9, 20], 4, 2, 32, 8, seed=3)
    for dtype in (torch.bfloat16, torch.float64):
        args = (q.to(dtype), k.to(dtype), v.to(dtype), tables, ctx, 0.2)
        out = native_decode.paged_decode_attention(*args)
        assert out.dtype == dtype
        assert torch.equal(out, paged_decode_attention(*args))
    strided = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    out = native_decode.paged_decode_attention(strided, k, v, tables, ctx, 0.2)
    assert torch.allclose(out, paged_decode_attention(q, k, v, tables, ctx, 0.2), atol=1e-5)
    q, k, v, tables, cu, ctx = _prefill_case([9, 20], [9, 4], 4, 2, 32, seed=3)
    args = (q.bfloat16(), k.bfloat16(), v.bfloat16(), tables, cu, ctx, 0.2)
    out = native_decode.paged_prefill_attention(*args)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, paged_prefill_attention(*args))


@requires_native
def test_build_is_cached_per_source_and_cpu(tmp_path: Path) -> None:
    first = native_decode.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    again = native_decode.build(tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p.suffix for p in first.parent.iterdir()] == [".so"]  # no partial files left


def test_extra_flags_reach_the_compiler_and_the_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HYDRANT_NATIVE_CFLAGS (or `extra`) is appended to the flags and keys its own build."""
    log = tmp_path / "calls"
    fake = tmp_path / "cc"  # records its arguments and writes an empty output file
    fake.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\n' + 'for a; do [ "$o" = -o ] && : > "$a"; o=$a; done\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(fake))
    plain = native_decode.build(tmp_path / "cache", extra=[])
    monkeypatch.setenv("HYDRANT_NATIVE_CFLAGS", "-mno-avx512f  -DX='a b'")
    assert native_decode.extra_cflags() == ["-mno-avx512f", "-DX=a b"]
    flagged = native_decode.build(tmp_path / "cache")
    assert flagged != plain
    assert native_decode.build(tmp_path / "cache", extra=["-mno-avx512f", "-DX=a b"]) == flagged
    calls = log.read_text().splitlines()
    assert len(calls) == 2  # the third build was the cached second one
    assert "-mno-avx512f" not in calls[0]
    assert calls[1].startswith(" ".join([*native_decode.CFLAGS, "-mno-avx512f", "-DX=a b"]))


def test_a_failing_compiler_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "false")  # exits 1 without output
    with pytest.raises(
        RuntimeError,
        match=r"compiling native_decode\.c, native_lora\.c, native_elementwise\.c failed",
    ):
        native_decode.build(tmp_path)
    assert not any(tmp_path.rglob("*.so"))


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear")
def test_onednn_linears_match_f_linear_and_keep_the_state_dict() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 256, bias=False))
    model.append(nn.Linear(256, 4096).to(torch.float64))  # not float32: left alone
    model.append(nn.Linear(256, 256))  # small: oneDNN's per-call cost would outweigh its speed
    before = {key: value.clone() for key, value in model.state_dict().items()}
    untouched = [p.data_ptr() for p in [*model[3].parameters(), *model[4].parameters()]]
    x = torch.randn(37, 256)
    with torch.inference_mode():
        expected = model[:3](x)
        assert use_onednn_linears(model) == 2
        assert type(model[0]) is OneDnnLinear and type(model[2]) is OneDnnLinear
        assert type(model[3]) is nn.Linear and type(model[4]) is nn.Linear
        got = model[:3](x)
        one_row = model[:3](x[:1])
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(one_row, expected[:1], atol=1e-5, rtol=1e-5)
    if packing_available():  # packed in place of the plain weight, not beside it
        assert model[0].weight.is_mkldnn and model[2].weight.is_mkldnn
        assert model[0].bias is not None and not model[0].bias.is_mkldnn
    assert [p.data_ptr() for p in [*model[3].parameters(), *model[4].parameters()]] == untouched
    after = model.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():  # the state dict holds the plain weights, unchanged
        assert not after[key].is_mkldnn
        assert torch.equal(after[key], value), key
    fresh = nn.Linear(256, 2048)
    fresh.load_state_dict({"weight": after["0.weight"], "bias": after["0.bias"]})
    with torch.inference_mode():
        assert torch.allclose(fresh(x), model[0](x), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not packing_available(), reason="this torch build cannot pack oneDNN weights")
def test_packed_weights_give_f_linear_at_every_row_count() -> None:
    """The layout is packed for one row count (PACK_ROWS_HINT); decode, prefill and odd
    row counts must all read it right, with and without a bias."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(1024, 512, generator=gen)
    bias = torch.randn(1024, generator=gen)
    packed = pack_weight(weight)
    assert packed.shape == weight.shape and torch.equal(packed.to_dense(), weight)
    with torch.inference_mode():
        for rows in (1, 3, PACK_ROWS_HINT, 61, 700):
            x = torch.randn(rows, 512, generator=gen)
            for b in (None, bias):
                want = F.linear(x, weight, b)
                got = onednn_linear(x, packed, b)
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-5), (rows, b is None)


def test_the_c_sources_are_package_data(tmp_path: Path) -> None:
    """An installed (non-editable) package compiles the kernels from its own copies: every
    source and header the build reads must be package data, or the engine falls back."""
    root = Path(__file__).resolve().parents[2]
    # -P: the checkout's top-level `kernels/` must not shadow the `kernels` distribution
    subprocess.run(
        [sys.executable, "-P", "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=root,
        check=True,
        capture_output=True,
        timeout=120,
    )
    built = tmp_path / "hydrant" / "kernels" / "cpu"
    needed = {path.name for path in (*native_decode.SOURCES, *native_decode.HEADERS)}
    assert needed >= {"native_decode.c", "native_lora.c", "native_simd.h"}
    assert needed <= {path.name for path in built.iterdir()}
