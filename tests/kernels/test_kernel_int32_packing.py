"""The int32 packing of hub checkpoint formats, against bit loops written from their specs."""

from __future__ import annotations

import pytest
import torch

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization.int32_packing import AWQ_ORDER, pack_int32, unpack_int32


def _pack_by_loop(codes: torch.Tensor, bits: int, order: list[int]) -> torch.Tensor:
    """Pack along the last dimension one word at a time, as AutoAWQ/GPTQ's exporters do."""
    per_word = 32 // bits
    rows, cols = codes.shape
    out = torch.zeros(rows, cols // per_word, dtype=torch.int64)
    for word in range(cols // per_word):
        for i in range(per_word):
            out[:, word] |= codes[:, word * per_word + order[i]].to(torch.int64) << (bits * i)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


@pytest.mark.parametrize(("bits", "interleaved"), [(2, False), (4, False), (8, False), (4, True)])
def test_pack_matches_the_exporters_loop_and_unpacks_back(bits: int, interleaved: bool) -> None:
    per_word = 32 // bits
    order = list(AWQ_ORDER) if interleaved else list(range(per_word))
    codes = torch.randint(
        0, 1 << bits, (5, per_word * 3), generator=torch.Generator().manual_seed(bits)
    )
    packed = pack_int32(codes, bits, dim=1, order=order)
    assert torch.equal(packed, _pack_by_loop(codes, bits, order))
    assert torch.equal(unpack_int32(packed, bits, dim=1, order=order), codes.to(torch.int32))


def test_packing_along_the_first_dimension_is_the_transpose() -> None:
    codes = torch.randint(0, 16, (16, 3), generator=torch.Generator().manual_seed(1))
    packed = pack_int32(codes, 4, dim=0)
    assert packed.shape == (2, 3)
    assert torch.equal(packed, pack_int32(codes.t(), 4, dim=1).t())
    assert torch.equal(unpack_int32(packed, 4, dim=0), codes.to(torch.int32))


def test_a_word_with_a_high_top_field_is_negative_and_round_trips() -> None:
    codes = torch.full((1, 8), 15)
    packed = pack_int32(codes, 4, dim=1)
    assert packed.item() == -1
    assert torch.equal(unpack_int32(packed, 4, dim=1), codes.to(torch.int32))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(KernelArgumentError):
        pack_int32(torch.zeros(1, 7, dtype=torch.int32), 4, dim=1)
    with pytest.raises(KernelArgumentError):
        pack_int32(torch.full((1, 8), 16), 4, dim=1)
    with pytest.raises(KernelArgumentError):
        unpack_int32(torch.zeros(1, 1, dtype=torch.int64), 4, dim=1)
    with pytest.raises(KernelArgumentError):
        unpack_int32(torch.zeros(1, 1, dtype=torch.int32), 4, dim=1, order=[0, 0, 1, 2, 3, 4, 5, 6])
