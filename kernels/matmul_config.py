"""Tile shapes and split-K plumbing for the weight-only matmul kernels.

Not autotuned (that needs GPU time): `matmul_config` picks tiles by M, the
dimension that separates decode (weight-bandwidth bound) from prefill
(compute bound), and splits K at small M so enough programs exist to keep
every SM reading weights. With a split, each K slice writes float32
partials that `finish` sums, which is deterministic and needs no atomics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from hydrant.kernels.triton_support import multiprocessor_count


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


# A tile for decode batches (M <= 16) chosen on a GPU (bench/gpu_kernels.py --tune); None
# keeps the split-K heuristic below. Its block_k is capped by `max_block_k` like any other.
DECODE_TILE: MatmulConfig | None = None


def matmul_config(m: int, n: int, k: int, device: torch.device, max_block_k: int) -> MatmulConfig:
    """Tile shape by M; split K at small M until there are about two programs per SM."""
    if m <= 16 and DECODE_TILE is not None:
        return replace(DECODE_TILE, block_k=min(DECODE_TILE.block_k, max_block_k))
    if m <= 16:
        block_m, block_n, warps, stages = 16, 64, 4, 4
    elif m <= 64:
        block_m, block_n, warps, stages = 32, 64, 4, 4
    else:
        block_m, block_n, warps, stages = 64, 128, 8, 3
    block_k = min(128 if m <= 64 else 64, max_block_k)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k)
    split_k = 1
    target = 2 * multiprocessor_count(device)
    while m <= 64 and tiles * split_k < target and split_k * 2 <= max(1, k_steps // 4):
        split_k *= 2
    return MatmulConfig(block_m, block_n, block_k, split_k, warps, stages)


def output(x: torch.Tensor, n: int, config: MatmulConfig) -> torch.Tensor:
    """The kernel's target: the result itself, or float32 partials when K is split."""
    if config.split_k == 1:
        return torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    return torch.empty((config.split_k, x.shape[0], n), dtype=torch.float32, device=x.device)


def finish(target: torch.Tensor, x: torch.Tensor, config: MatmulConfig) -> torch.Tensor:
    return target if config.split_k == 1 else target.sum(dim=0).to(x.dtype)


def grid(m: int, n: int, config: MatmulConfig) -> tuple[int, int, int]:
    return (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), config.split_k)
