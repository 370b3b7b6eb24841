"""How many KV blocks fit, and the cache tensors themselves.

On CUDA the number comes from measurement, the way vLLM's worker does it:
run one forward of the largest step the scheduler can build, read the peak
memory it needed (weights plus activations), and give the KV cache what is
left of `gpu_memory_utilization` x total memory. On CPU there is no "free"
memory we could rely on (other processes take it), so an explicit byte budget
(`EngineConfig.kv_cache_bytes`) decides. `num_gpu_blocks` overrides both.

A layer's cache is `(k_cache, v_cache)` in the compute dtype, or, with
`kv_cache_dtype="int8"`, `(k_cache, v_cache, k_scale, v_scale)`: int8 codes
`[num_blocks, block_size, Hkv, D]` plus float32 scales `[num_blocks,
block_size, Hkv]`, one per token per head (the layout of
`hydrant.kernels.ops.write_kv`). Every tensor of a layer has the block on
dim 0, so copy-on-write and byte counts treat them alike. The bytes per token
come from `capacity.kv_bytes_per_token`, the same arithmetic `hydrant
capacity` prints, so the planner and the engine never disagree.
"""

from __future__ import annotations

import logging

import torch

from hydrant.engine.capacity import kv_bytes_per_token
from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.errors import KVCacheCapacityError
from hydrant.engine.host_memory import zero_mapped_tensor

logger = logging.getLogger(__name__)

KVCache = tuple[torch.Tensor, ...]  # (k, v) or, int8, (k, v, k_scale, v_scale)
KVCaches = list[KVCache]

_KV_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
}


def kv_storage_dtype(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype the cache stores: int8 codes, or the compute dtype with `"auto"`."""
    return torch.int8 if config.kv_cache_dtype == "int8" else dtype


def bytes_per_block(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for `block_size` tokens; int8 (`dtype=torch.int8`) with scales."""
    return kv_bytes_per_token(model.shape, _KV_DTYPE_NAMES[dtype]) * block_size


def num_blocks_from_budget(
    model: ModelConfig, config: EngineConfig, dtype: torch.dtype, peak_bytes: int | None
) -> int:
    """Blocks that fit: the override, else the CPU byte budget, else measured CUDA memory.

    `dtype` is the compute dtype; `config.kv_cache_dtype` decides what a block stores.
    """
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    per_block = bytes_per_block(model, config.block_size, kv_storage_dtype(config, dtype))
    if config.device == "cpu" or peak_bytes is None:
        return config.kv_cache_bytes // per_block
    device = torch.device(config.device)
    free, total = torch.cuda.mem_get_info(device)
    # memory torch does not manage: the CUDA context, NCCL, other processes on the GPU
    outside_torch = max(0, total - free - torch.cuda.memory_reserved(device))
    available = int(total * config.gpu_memory_utilization) - peak_bytes - outside_torch
    logger.info(
        "KV budget: %.2f GiB of %.2f GiB (profiled peak %.2f GiB, %.2f GiB outside torch)",
        max(available, 0) / 2**30,
        total / 2**30,
        peak_bytes / 2**30,
        outside_torch / 2**30,
    )
    return max(available, 0) // per_block


def check_capacity(num_blocks: int, block_size: int, max_model_len: int) -> None:
    """Refuse a pool that cannot hold one full-length sequence."""
    needed = -(-max_model_len // block_size)
    if num_blocks < needed:
        raise KVCacheCapacityError(
            f"the KV cache holds {num_blocks} blocks of {block_size} tokens, but one "
            f"sequence of max_model_len={max_model_len} needs {needed}; raise the KV budget "
            "or lower max_model_len"
        )


def allocate_kv_caches(
    model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: str
) -> KVCaches:
    """Per layer (k_cache, v_cache), each [num_blocks, block_size, Hkv, D], plus the two
    float32 scale tensors [num_blocks, block_size, Hkv] when `dtype` is int8.

    On CPU the tensors are lazily zeroed memory maps (see host_memory.py).
    """
    shape = (num_blocks, block_size, model.num_key_value_heads, model.head_dim)
    shapes: list[tuple[tuple[int, ...], torch.dtype]] = [(shape, dtype), (shape, dtype)]
    if dtype == torch.int8:
        shapes += [(shape[:3], torch.float32), (shape[:3], torch.float32)]

    def zeros(size: tuple[int, ...], kind: torch.dtype) -> torch.Tensor:
        if torch.device(device).type == "cpu":
            return zero_mapped_tensor(size, kind)
        return torch.zeros(size, dtype=kind, device=device)

    return [
        tuple(zeros(size, kind) for size, kind in shapes) for _ in range(model.num_hidden_layers)
    ]


def cache_bytes(caches: KVCaches) -> int:
    """Bytes the cache tensors hold, scales included."""
    return sum(t.numel() * t.element_size() for layer in caches for t in layer)


def copy_blocks(caches: KVCaches, copies: list[tuple[int, int]]) -> None:
    """Apply copy-on-write copies (src block -> dst block) in every layer, scales included."""
    if not copies:
        return
    device = caches[0][0].device
    src = torch.tensor([c[0] for c in copies], dtype=torch.long, device=device)
    dst = torch.tensor([c[1] for c in copies], dtype=torch.long, device=device)
    for layer in caches:
        for tensor in layer:
            tensor.index_copy_(0, dst, tensor.index_select(0, src))
