"""The cpu backend's PyTorch paged attention against a naive dense computation, sequence by
sequence."""

from __future__ import annotations

import itertools

import pytest
import torch

from hydrant.kernels.cpu.attention import (
    MAX_DECODE_GROUP,
    PAD_SLACK,
    cut_groups,
    paged_decode_attention,
    paged_prefill_attention,
    write_kv,
)

BS, HKV, GROUP, D = 4, 2, 3, 8
H = HKV * GROUP


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
    """q [n, H, D] at positions offset.., k/v [ctx, Hkv, D]; causal, GQA by repetition."""
    k = k.repeat_interleave(GROUP, dim=1)
    v = v.repeat_interleave(GROUP, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
    rows = torch.arange(q.shape[0])[:, None] + offset
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > rows, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _setup(lens: list[int], seed: int) -> tuple[torch.Tensor, ...]:
    """Random K/V for each sequence, written through write_kv into shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // BS) for n in lens]
    blocks = torch.randperm(sum(need) + 3, generator=gen).tolist()
    k_cache = torch.zeros(len(blocks), BS, HKV, D)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
    keys, values = [], []
    for i, n in enumerate(lens):
        own = [blocks.pop() for _ in range(need[i])]
        tables[i, : need[i]] = torch.tensor(own, dtype=torch.int32)
        k = torch.randn(n, HKV, D, generator=gen)
        v = torch.randn(n, HKV, D, generator=gen)
        slots = torch.tensor([own[p // BS] * BS + p % BS for p in range(n)])
        write_kv(k, v, k_cache, v_cache, slots)
        keys.append(k)
        values.append(v)
    return k_cache, v_cache, tables, keys, values  # type: ignore[return-value]


@pytest.mark.parametrize("batch", [3, 16, MAX_DECODE_GROUP + 5, 2 * MAX_DECODE_GROUP + 3])
@pytest.mark.parametrize("presorted", [False, True])
def test_decode_matches_naive_in_any_batch_order(batch: int, presorted: bool) -> None:
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(1, 40, (batch,), generator=gen).tolist()
    if presorted:  # the model runner's order: groups become slices of the batch
        lens.sort()
    k_cache, v_cache, tables, keys, values = _setup(lens, seed=batch)
    q = torch.randn(batch, H, D, generator=gen)
    out = paged_decode_attention(
        q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), D**-0.5
    )
    for i, n in enumerate(lens):
        expected = _naive(q[i : i + 1], keys[i], values[i], n - 1)
        assert torch.allclose(out[i : i + 1], expected, atol=1e-5), f"sequence {i}"


def test_decode_groups_bound_padding_and_size() -> None:
    gen = torch.Generator().manual_seed(3)
    lens = sorted(torch.randint(1, 2000, (300,), generator=gen).tolist())
    groups = cut_groups(lens, BS)
    assert groups[0][0] == 0 and groups[-1][1] == len(lens)
    for (_, end), (start, _) in itertools.pairwise(groups):
        assert end == start  # consecutive, nothing dropped or repeated
    for start, end in groups:
        rows = end - start
        assert rows <= MAX_DECODE_GROUP
        padded = rows * -(-lens[end - 1] // BS) * BS
        alone = sum(-(-n // BS) * BS for n in lens[start:end])
        assert rows == 1 or padded <= PAD_SLACK * alone
    assert cut_groups([], BS) == []
    assert cut_groups([5] * 200, BS) == [(0, 64), (64, 128), (128, 192), (192, 200)]


def test_prefill_with_earlier_context_matches_naive() -> None:
    lens = [9, 1, 17, 6]
    q_lens = [9, 1, 5, 2]  # whole prompt, one token, chunks after cached context
    k_cache, v_cache, tables, keys, values = _setup(lens, seed=7)
    q = torch.randn(sum(q_lens), H, D, generator=torch.Generator().manual_seed(8))
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    out = paged_prefill_attention(
        q, k_cache, v_cache, tables, cu, torch.tensor(lens, dtype=torch.int32), D**-0.5
    )
    for i, (n, m) in enumerate(zip(lens, q_lens, strict=True)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        expected = _naive(q[rows], keys[i], values[i], n - m)
        assert torch.allclose(out[rows], expected, atol=1e-5), f"sequence {i}"


def test_write_kv_skips_negative_slots() -> None:
    k_cache = torch.zeros(2, BS, HKV, D)
    v_cache = torch.zeros_like(k_cache)
    key = torch.ones(3, HKV, D)
    write_kv(key, key * 2, k_cache, v_cache, torch.tensor([0, -1, 5]))
    flat = k_cache.view(-1, HKV, D)
    assert flat[0].eq(1).all() and flat[5].eq(1).all()
    assert flat.sum() == 2 * HKV * D
    assert v_cache.view(-1, HKV, D)[5].eq(2).all()
