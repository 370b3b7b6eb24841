"""Low-bit codes packed into int32 words: the storage of the hub's quantized checkpoint formats.

AWQ, GPTQ and compressed-tensors all store 4-bit (and compressed-tensors 8-bit)
codes `32 // bits` to an int32 word, along one dimension, but differ in which
dimension and in which order the codes sit in a word:

- GPTQ `qweight` `[K // 8, N]` packs along K, `qzeros` `[K // G, N // 8]`
  along N, code `i` of a word in bits `4i .. 4i + 3` (sequential order);
- AWQ (GEMM) `qweight` `[K, N // 8]` and `qzeros` `[K // G, N // 8]` pack
  along N in the interleaved order `[0, 2, 4, 6, 1, 3, 5, 7]`: bits `4i ..`
  hold column `order[i]` of the word's eight;
- compressed-tensors `pack-quantized` `weight_packed` `[N, K // 8]` packs
  along K, sequential.

These helpers only move bit fields (unsigned); what a code means (a signed
offset, a zero point stored minus one) is the reader's business. Hydrant's
kernels use their own byte layout (`hydrant.kernels.int4_layout`): a hub
checkpoint is unpacked with these and repacked once, at load.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hydrant.kernels.arguments import require

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _check_order(bits: int, order: Sequence[int] | None) -> tuple[int, list[int]]:
    require(bits in (2, 4, 8), f"bits must be 2, 4 or 8, got {bits}")
    per_word = 32 // bits
    positions = list(order) if order is not None else list(range(per_word))
    require(
        sorted(positions) == list(range(per_word)),
        f"order must be a permutation of 0..{per_word - 1}, got {positions}",
    )
    return per_word, positions


def unpack_int32(
    packed: torch.Tensor, bits: int, dim: int, order: Sequence[int] | None = None
) -> torch.Tensor:
    """Codes (int32, 0 .. 2**bits - 1) of `packed`, its `dim` grown `32 // bits` times.

    Bit field `i` of each word is the code at index `word * per_word + order[i]`
    along `dim` (`order` defaults to sequential).
    """
    require(packed.dtype == torch.int32, f"packed codes must be int32, got {packed.dtype}")
    per_word, positions = _check_order(bits, order)
    dim = dim % packed.dim()
    mask = (1 << bits) - 1
    moved = packed.movedim(dim, -1)
    fields = torch.stack(
        [
            torch.bitwise_and(torch.bitwise_right_shift(moved, bits * i), mask)
            for i in range(per_word)
        ],
        dim=-1,
    )  # [..., words, field]
    codes = torch.empty_like(fields)
    codes[..., positions] = fields  # field i lands at slot order[i]
    return codes.reshape(*moved.shape[:-1], moved.shape[-1] * per_word).movedim(-1, dim)


def pack_int32(
    codes: torch.Tensor, bits: int, dim: int, order: Sequence[int] | None = None
) -> torch.Tensor:
    """Inverse of `unpack_int32`: codes `0 .. 2**bits - 1` into int32 words along `dim`."""
    per_word, positions = _check_order(bits, order)
    dim = dim % codes.dim()
    require(
        codes.shape[dim] % per_word == 0,
        f"dimension {dim} of size {codes.shape[dim]} is not a multiple of {per_word}",
    )
    moved = codes.movedim(dim, -1).to(torch.int64)
    require(
        bool(((moved >= 0) & (moved < (1 << bits))).all()),
        f"codes must lie in 0..{(1 << bits) - 1}",
    )
    words = moved.reshape(*moved.shape[:-1], moved.shape[-1] // per_word, per_word)
    packed = torch.zeros(words.shape[:-1], dtype=torch.int64, device=codes.device)
    for i, slot in enumerate(positions):
        packed |= words[..., slot] << (bits * i)
    # Two's complement: a word whose top field is >= 2**(bits-1) is a negative int32.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32).movedim(-1, dim)
