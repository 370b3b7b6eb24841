"""Lazily zeroed host tensors, each backed by its own anonymous memory map.

Why not `torch.zeros` for the KV cache on CPU: zeroing touches every page,
and on a VM a first touch costs a fault of microseconds, so allocating a
1 GB cache costs about as much as reading a 1 GB checkpoint, on every load
and every wake. An anonymous mapping is zero by definition: the kernel hands
out zero pages on first touch, so the cache is allocated in O(1) and a wake
pays only for the blocks that requests really write.

Each tensor owns its mapping: freeing the tensor unmaps it and the memory goes
straight back to the OS (no allocator cache keeps a sleeping engine's KV).
"""

from __future__ import annotations

import mmap

import torch

# Below this a plain allocation is as cheap and wastes no partial page.
MIN_MAPPED_BYTES = 1 << 20


def zero_mapped_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor of `shape`; its pages are materialized on first write."""
    numel = 1
    for dim in shape:
        numel *= dim
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < MIN_MAPPED_BYTES:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(
        -1,
        nbytes,
        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        prot=mmap.PROT_READ | mmap.PROT_WRITE,
    )
    # the tensor keeps `region` alive; the mapping is released with the last view of it
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)
