"""Builders for kernel tests: NaN-poisoned paged caches, block tables, error metrics.

Caches start all-NaN (int8 caches: NaN scales) and only the slots a sequence's
context covers get real values; unused block-table entries point at a block
that stays NaN. A kernel that reads one element outside the context, or
leaves one output element unwritten, produces NaN and fails the test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POISON_BLOCK = 0
# Relative error bounds ||out - ref|| / ||ref|| by activation dtype. bfloat16 is
# loose because the interpreter truncates float32 -> bfloat16 (CUDA rounds).
REL_TOL = {torch.float32: 1e-3, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


@dataclass
class PagedKV:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    block_tables: torch.Tensor
    context_lens: torch.Tensor

    @property
    def scales(self) -> dict[str, torch.Tensor | None]:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    return float((out64 - ref64).norm() / ref64.norm().clamp(min=1e-30))


def make_paged_kv(
    lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    int8: bool = False,
    spare_blocks: int = 2,
) -> PagedKV:
    """Random K/V for sequences of `lens` tokens in shuffled blocks of a NaN-poisoned cache."""
    needed = [-(-n // block_size) for n in lens]
    max_blocks = max(needed) + 1
    num_blocks = 1 + sum(needed) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.full((len(lens), max_blocks), POISON_BLOCK, dtype=torch.int32)
    ks: torch.Tensor | None
    vs: torch.Tensor | None
    if int8:
        k = torch.full(shape, -128, dtype=torch.int8)
        v = torch.full(shape, -128, dtype=torch.int8)
        ks = torch.full(shape[:3], float("nan"))
        vs = torch.full(shape[:3], float("nan"))
    else:
        k = torch.full(shape, float("nan"), dtype=dtype)
        v = torch.full(shape, float("nan"), dtype=dtype)
        ks = vs = None
    for b, n in enumerate(lens):
        blocks = [ids.pop() for _ in range(needed[b])]
        tables[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        for pos in range(n):
            blk, off = blocks[pos // block_size], pos % block_size
            if int8:
                k[blk, off] = torch.randint(
                    -127, 128, (num_kv_heads, head_dim), generator=gen, dtype=torch.int8
                )
                v[blk, off] = torch.randint(
                    -127, 128, (num_kv_heads, head_dim), generator=gen, dtype=torch.int8
                )
                assert ks is not None and vs is not None
                ks[blk, off] = torch.rand(num_kv_heads, generator=gen) * 0.02 + 1e-3
                vs[blk, off] = torch.rand(num_kv_heads, generator=gen) * 0.02 + 1e-3
            else:
                k[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
                v[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
    return PagedKV(k, v, ks, vs, tables, torch.tensor(lens, dtype=torch.int32))


def gathered(kv: PagedKV, b: int, which: str) -> torch.Tensor:
    """Sequence b's K or V as dense float32 `[len, Hkv, D]` (dequantized for int8)."""
    cache = kv.k_cache if which == "k" else kv.v_cache
    scale = kv.k_scale if which == "k" else kv.v_scale
    n = int(kv.context_lens[b])
    bs = cache.shape[1]
    rows = [cache[int(kv.block_tables[b, p // bs]), p % bs].to(torch.float32) for p in range(n)]
    dense = torch.stack(rows)
    if scale is not None:
        s = torch.stack([scale[int(kv.block_tables[b, p // bs]), p % bs] for p in range(n)])
        dense = dense * s[:, :, None]
    return dense
