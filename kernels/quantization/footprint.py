"""Bytes held by weights and by the KV cache, before and after quantization.

Byte counts are what the platform sizes worker pools and KV budgets by, so
they count every stored tensor, scales and zero points included, never just
the codes. For the KV cache that means the float32 per-token, per-head scales
of the int8 layout: `head_dim + 4` bytes per token per head against
`2 * head_dim` in float16 (53% at head_dim 64, 52% at 128).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from hydrant.kernels.errors import KernelArgumentError


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the given tensors, each distinct storage view counted once."""
    seen: set[tuple[int, int, torch.dtype, tuple[int, ...]]] = set()
    total = 0
    for t in tensors:
        # an opaque (oneDNN-packed) tensor has no data pointer: it is its own storage
        address = id(t) if t.is_mkldnn else t.data_ptr()
        key = (address, t.numel(), t.dtype, tuple(t.shape))
        if t.device.type != "meta" and key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (tied weights counted once)."""
    tensors = [*module.parameters(), *(b for b in module.buffers() if b is not None)]
    return tensor_bytes(tensors)


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_tokens: int,
    dtype: torch.dtype | str = torch.float16,
) -> int:
    """Bytes of K and V caches for `num_tokens` slots; `dtype="int8"` adds the float32 scales."""
    if min(num_layers, num_kv_heads, head_dim, num_tokens) < 0:
        raise KernelArgumentError("KV cache dimensions must be non-negative")
    per_head = head_dim + 4 if dtype in ("int8", torch.int8) else None
    if per_head is None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise KernelArgumentError(
                f"KV cache dtype must be a float dtype or 'int8', got {dtype}"
            )
        per_head = head_dim * torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * num_tokens * per_head


@dataclass(frozen=True)
class KVCacheReport:
    """KV bytes for the same number of slots in the float layout and the int8 layout."""

    bytes_before: int
    bytes_after: int

    @property
    def ratio(self) -> float:
        return self.bytes_after / self.bytes_before if self.bytes_before else 1.0


def kv_cache_report(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_tokens: int,
    dtype: torch.dtype = torch.float16,
) -> KVCacheReport:
    return KVCacheReport(
        bytes_before=kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, dtype),
        bytes_after=kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, "int8"),
    )
