"""How many KV blocks fit, and the cache tensors themselves.

On CUDA the number comes from measurement, the way vLLM's worker does it:
run one forward of the largest step the scheduler can build, read the peak
memory it needed (weights plus activations), and give the KV cache what is
left of `gpu_memory_utilization` x total memory. On CPU there is no "free"
memory we could rely on (other processes take it), so an explicit byte budget
(`EngineConfig.kv_cache_bytes`) decides. `num_gpu_blocks` overrides both.
"""

from __future__ import annotations

import logging

import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.errors import KVCacheCapacityError

logger = logging.getLogger(__name__)

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def bytes_per_block(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for `block_size` tokens."""
    element = torch.empty((), dtype=dtype).element_size()
    per_token = 2 * model.num_hidden_layers * model.num_key_value_heads * model.head_dim
    return per_token * block_size * element


def num_blocks_from_budget(
    model: ModelConfig, config: EngineConfig, dtype: torch.dtype, peak_bytes: int | None
) -> int:
    """Blocks that fit: the override, else the CPU byte budget, else measured CUDA memory."""
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    per_block = bytes_per_block(model, config.block_size, dtype)
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
    """Per layer (k_cache, v_cache), each [num_blocks, block_size, Hkv, D]."""
    shape = (num_blocks, block_size, model.num_key_value_heads, model.head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(model.num_hidden_layers)
    ]


def copy_blocks(caches: KVCaches, copies: list[tuple[int, int]]) -> None:
    """Apply copy-on-write copies (src block -> dst block) in every layer."""
    if not copies:
        return
    device = caches[0][0].device
    src = torch.tensor([c[0] for c in copies], dtype=torch.long, device=device)
    dst = torch.tensor([c[1] for c in copies], dtype=torch.long, device=device)
    for k_cache, v_cache in caches:
        k_cache.index_copy_(0, dst, k_cache.index_select(0, src))
        v_cache.index_copy_(0, dst, v_cache.index_select(0, src))
