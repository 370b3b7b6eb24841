"""Punica's SGMV and BGMV: the Triton kernels (on the interpreter) against the reference, and
the reference against a dense per-row loop.

Adapters of ranks 1..64 share one stack padded to the largest rank (the engine's layout:
unused rank rows and columns are zero), rows of slot -1 must come back bit for bit,
segments are ragged and some are empty, and `y` is a column slice of a wider output (a
fused projection), so the kernels must honour its row stride and leave the other columns.
"""

from __future__ import annotations

import os

import pytest
import torch
from kernel_testing import REL_TOL, rel_error

from hydrant.kernels.cpu import lora as cpu_lora
from hydrant.kernels.cpu import native_decode
from hydrant.kernels.cpu.backend import NATIVE
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.table import KernelBackend
from hydrant.kernels.triton_backend import TRITON, triton_interpreter_enabled

K, N = 48, 40
RANKS = [1, 8, 64, 5]  # slots 0..3; the stack is padded to 64


def _row(name: str) -> KernelBackend:
    if name == "triton":
        pytest.importorskip("triton")
        if not triton_interpreter_enabled():
            pytest.skip("the Triton kernels on the CPU need TRITON_INTERPRET=1")
        return TRITON
    return NATIVE if name == "cpu" else REFERENCE


@pytest.fixture(params=["reference", "triton", "cpu"])
def row(request: pytest.FixtureRequest) -> KernelBackend:
    return _row(request.param)


@pytest.fixture(params=["reference", "triton"])
def checked_row(request: pytest.FixtureRequest) -> KernelBackend:
    """The rows that validate every call (the cpu row trusts the engine's arguments)."""
    return _row(request.param)


def _stack(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    r_max = max(RANKS)
    a = torch.zeros(len(RANKS), r_max, K, dtype=dtype)
    b = torch.zeros(len(RANKS), N, r_max, dtype=dtype)
    for slot, rank in enumerate(RANKS):
        a[slot, :rank] = torch.randn(rank, K, generator=gen).to(dtype) / rank**0.5
        b[slot, :, :rank] = torch.randn(N, rank, generator=gen).to(dtype)
    scales = torch.tensor([2.0, 0.5, 0.25, 1.0])
    return a, b, scales


def _dense(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, slots: list[int]
):
    """Row by row, each with only its own adapter's true rank (no padding involved)."""
    out = torch.zeros(x.shape[0], N, dtype=torch.float64)
    for t, slot in enumerate(slots):
        if slot >= 0:
            rank = RANKS[slot]
            xa = x[t].double() @ a[slot, :rank].double().t()
            out[t] = scales[slot].double() * (xa @ b[slot, :, :rank].double().t())
    return out


def _wide_y(
    rows: int, gen: torch.Generator, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A [rows, 3N] output whose middle N columns are the kernels' `y` (a strided view)."""
    wide = torch.randn(rows, 3 * N, generator=gen).to(dtype)
    return wide, wide[:, N : 2 * N]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bgmv_matches_the_dense_loop_and_skips_base_rows(
    row: KernelBackend, gen: torch.Generator, dtype: torch.dtype
) -> None:
    a, b, scales = _stack(gen, dtype)
    slots = [2, -1, 0, 3, 1, -1, 2, 0]
    x = torch.randn(len(slots), K, generator=gen).to(dtype)
    wide, y = _wide_y(len(slots), gen, dtype)
    before = wide.clone()
    row.lora_bgmv(y, x, a, b, scales, torch.tensor(slots, dtype=torch.int32))
    want = before[:, N : 2 * N].double() + _dense(x, a, b, scales, slots)
    assert rel_error(y, want) < REL_TOL[dtype]
    base = [t for t, s in enumerate(slots) if s < 0]
    assert torch.equal(wide[base], before[base]), "rows without an adapter changed"
    assert torch.equal(wide[:, :N], before[:, :N]) and torch.equal(
        wide[:, 2 * N :], before[:, 2 * N :]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sgmv_ragged_and_empty_segments(
    row: KernelBackend, gen: torch.Generator, dtype: torch.dtype
) -> None:
    a, b, scales = _stack(gen, dtype)
    # lengths 5, 0 (empty), 37 (several row tiles), 1, 0, 20 (base model), 16
    lengths = [5, 0, 37, 1, 0, 20, 16]
    seg_slots = [3, 1, 0, 2, 0, -1, 1]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    per_row = [s for s, n in zip(seg_slots, lengths, strict=True) for _ in range(n)]
    x = torch.randn(starts[-1], K, generator=gen).to(dtype)
    wide, y = _wide_y(starts[-1], gen, dtype)
    before = wide.clone()
    row.lora_sgmv(
        y,
        x,
        a,
        b,
        scales,
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(seg_slots, dtype=torch.int64),
        max(lengths),
    )
    want = before[:, N : 2 * N].double() + _dense(x, a, b, scales, per_row)
    assert rel_error(y, want) < REL_TOL[dtype]
    base = [t for t, s in enumerate(per_row) if s < 0]
    assert base and torch.equal(wide[base], before[base]), "rows without an adapter changed"


def test_rank_slice_of_the_stack(row: KernelBackend, gen: torch.Generator) -> None:
    """The engine passes `A[:, :r]`, `B[:, :, :r]` (the batch's largest rank): strided views."""
    a, b, scales = _stack(gen, torch.float32)
    slots = [1, 3, -1]  # ranks 8 and 5: the first 8 columns of the stack suffice
    x = torch.randn(3, K, generator=gen)
    y = torch.zeros(3, N)
    row.lora_bgmv(y, x, a[:, :8], b[:, :, :8], scales, torch.tensor(slots))
    assert rel_error(y, _dense(x, a, b, scales, slots)) < REL_TOL[torch.float32]
    y2 = torch.zeros(3, N)
    row.lora_sgmv(
        y2, x, a[:, :8], b[:, :, :8], scales, torch.tensor([0, 1, 2, 3]), torch.tensor(slots)
    )
    assert rel_error(y2, y) < REL_TOL[torch.float32]


def test_no_adapter_at_all_leaves_y_alone(row: KernelBackend, gen: torch.Generator) -> None:
    a, b, scales = _stack(gen, torch.float32)
    x, y = torch.randn(4, K, generator=gen), torch.randn(4, N, generator=gen)
    before = y.clone()
    row.lora_bgmv(y, x, a, b, scales, torch.full((4,), -1))
    row.lora_sgmv(y, x, a, b, scales, torch.tensor([0, 4]), torch.tensor([-1]))
    row.lora_sgmv(y[:0], x[:0], a, b, scales, torch.tensor([0]), torch.tensor([], dtype=torch.long))
    assert torch.equal(y, before)


def test_shape_errors_are_named(checked_row: KernelBackend, gen: torch.Generator) -> None:
    row = checked_row
    a, b, scales = _stack(gen, torch.float32)
    x, y = torch.randn(2, K), torch.zeros(2, N)
    with pytest.raises(KernelArgumentError, match="lora_b shape"):
        row.lora_bgmv(y, x, a, b[:, :, :8], scales, torch.tensor([0, 1]))
    with pytest.raises(KernelArgumentError, match="x has K"):
        row.lora_bgmv(y, torch.zeros(2, K + 1), a, b, scales, torch.tensor([0, 1]))
    with pytest.raises(KernelArgumentError, match="one more is needed"):
        row.lora_sgmv(y, x, a, b, scales, torch.tensor([0, 2]), torch.tensor([0, 1]))
    with pytest.raises(KernelArgumentError, match="token_slots has 1"):
        row.lora_bgmv(y, x, a, b, scales, torch.tensor([0]))


requires_native = pytest.mark.skipif(
    not native_decode.available() and os.environ.get("CI") != "true",
    reason="no C compiler here (in CI the kernels must build)",
)


@requires_native
def test_cpu_row_runs_the_c_kernel_in_float32(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float32 BGMV and SGMV take native_lora.c, not a PyTorch fallback (made to fail here)."""

    def no_fallback(*args: object) -> None:
        raise AssertionError("the cpu row fell back to PyTorch")

    monkeypatch.setattr(cpu_lora, "_torch_bgmv", no_fallback)
    monkeypatch.setattr(cpu_lora.reference, "lora_sgmv", no_fallback)
    a, b, scales = _stack(gen, torch.float32)
    slots = [3, -1, 0, 2]
    x, y = torch.randn(4, K, generator=gen), torch.zeros(4, N)
    NATIVE.lora_bgmv(y, x, a, b, scales, torch.tensor(slots, dtype=torch.int32))
    assert rel_error(y, _dense(x, a, b, scales, slots)) < REL_TOL[torch.float32]
    y2 = torch.zeros(4, N)
    starts, seg_slots = torch.tensor([0, 1, 2, 3, 4]), torch.tensor(slots)
    NATIVE.lora_sgmv(y2, x, a, b, scales, starts, seg_slots, 1)
    assert rel_error(y2, y) < REL_TOL[torch.float32]


@requires_native
def test_cpu_row_reads_b_in_either_layout(gen: torch.Generator) -> None:
    """B with its output dimension contiguous (the rank columns strided) gives the same deltas
    as the stacks' layout: the kernel follows B's strides, rank-sliced views included, in
    BGMV and in SGMV (whose segments of 4+ rows read a transposed copy of the stacks' B)."""
    a, b, scales = _stack(gen, torch.float32)
    b_out_major = b.transpose(1, 2).contiguous().transpose(1, 2)  # same values, [slots, N, R]
    slots = torch.tensor([1, 3, -1, 0, 1], dtype=torch.int32)
    x = torch.randn(5, K, generator=gen)
    want = _dense(x, a, b, scales, slots.tolist())
    for lora_b in (b, b_out_major):
        for rank in (8, 64):  # every slot used here has a rank of at most 8
            y = torch.zeros(5, N)
            NATIVE.lora_bgmv(y, x, a[:, :rank], lora_b[:, :, :rank], scales, slots)
            assert rel_error(y, want) < REL_TOL[torch.float32]
            assert torch.equal(y[2], torch.zeros(N))
            y = torch.zeros(5, N)
            starts, seg_slots = torch.tensor([0, 4, 5]), torch.tensor([1, 0])
            NATIVE.lora_sgmv(y, x, a[:, :rank], lora_b[:, :, :rank], scales, starts, seg_slots)
            assert rel_error(y, _dense(x, a, b, scales, [1, 1, 1, 1, 0])) < REL_TOL[torch.float32]


@requires_native
def test_cpu_row_threads_split_rows_without_changing_a_bit(gen: torch.Generator) -> None:
    """With several threads the C kernel splits rows (and segments' rows) among them; each row
    is computed alone, so the result is bit for bit the one-thread result."""
    a, b, scales = _stack(gen, torch.float32)
    rows = 67
    slots = torch.randint(-1, len(RANKS), (rows,), generator=gen, dtype=torch.int32)
    starts, seg_slots = torch.tensor([0, 30, 31, 31, 67]), torch.tensor([2, 0, 1, 3])
    x = torch.randn(rows, K, generator=gen)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            y, y2 = torch.zeros(rows, N), torch.zeros(rows, N)
            NATIVE.lora_bgmv(y, x, a, b, scales, slots)
            NATIVE.lora_sgmv(y2, x, a, b, scales, starts, seg_slots)
            results.append((y, y2))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    assert (
        rel_error(results[0][0], _dense(x, a, b, scales, slots.tolist())) < REL_TOL[torch.float32]
    )


@requires_native
def test_cpu_row_refuses_a_slot_past_the_stacks(gen: torch.Generator) -> None:
    """The C kernel would read past the stacks: it raises before adding anything."""
    a, b, scales = _stack(gen, torch.float32)
    x, y = torch.randn(3, K, generator=gen), torch.randn(3, N, generator=gen)
    before = y.clone()
    with pytest.raises(KernelArgumentError, match="token_slots has a slot outside"):
        NATIVE.lora_bgmv(y, x, a, b, scales, torch.tensor([0, len(RANKS), 1], dtype=torch.int32))
    with pytest.raises(KernelArgumentError, match="seg_slots has a slot"):
        NATIVE.lora_sgmv(y, x, a, b, scales, torch.tensor([0, 1, 3]), torch.tensor([0, 9]))
    with pytest.raises(KernelArgumentError, match="seg_starts a row"):
        NATIVE.lora_sgmv(y, x, a, b, scales, torch.tensor([0, 1, 4]), torch.tensor([0, 1]))
    assert torch.equal(y, before)


@requires_native
def test_cpu_row_sgmv_over_a_fused_stack(gen: torch.Generator) -> None:
    """A fused projection's B is block-structured (each part's outputs read only its own rank
    columns) and the C kernel skips its zero blocks for a slot with several rows (a prefill
    segment, or decode rows of one adapter): the sums must be those of the whole B, on
    output blocks that straddle the parts."""
    rank, parts = 8, 2
    a = torch.randn(3, rank * parts, K, generator=gen)
    b = torch.randn(3, N, rank * parts, generator=gen)
    b[:, :23, 1::2] = 0  # part 0: outputs 0..22 (blocks of 16 straddle the boundary)
    b[:, 23:, 0::2] = 0  # part 1: outputs 23..39
    scales = torch.tensor([0.5, 2.0, 1.0])
    starts, seg_slots = [0, 6, 9, 20], [2, 0, 1]
    x = torch.randn(starts[-1], K, generator=gen)
    y = torch.randn(starts[-1], N, generator=gen)
    want = y.double().clone()
    for first, end, slot in zip(starts, starts[1:], seg_slots, strict=False):
        mid = x[first:end].double() @ a[slot].double().t()
        want[first:end] += scales[slot].double() * (mid @ b[slot].double().t())
    before = y.clone()
    NATIVE.lora_sgmv(y, x, a, b, scales, torch.tensor(starts), torch.tensor(seg_slots))
    assert rel_error(y, want) < REL_TOL[torch.float32]
    # BGMV groups its rows by slot, so a slot with several rows takes the same path
    per_row = torch.tensor([2] * 6 + [0] * 3 + [1] * 11, dtype=torch.int32)
    shuffle = torch.randperm(len(per_row), generator=gen)
    y = before[shuffle].clone()
    NATIVE.lora_bgmv(y, x[shuffle], a, b, scales, per_row[shuffle])
    assert rel_error(y, want[shuffle]) < REL_TOL[torch.float32]


@pytest.mark.parametrize("rank", range(1, 65))
def test_every_stack_rank_from_1_to_64(row: KernelBackend, gen: torch.Generator, rank: int) -> None:
    """The stack as the engine cuts it for a step (its largest rank), every rank from 1 to
    64: below, at and above the kernels' 16-wide tiles and reductions; BGMV and SGMV with base
    rows and an empty segment, each row against a float64 product of its own adapter."""
    slots = 3
    a = torch.randn(slots, rank, K, generator=gen) / rank**0.5
    b = torch.randn(slots, N, rank, generator=gen)
    scales = torch.tensor([0.5, 2.0, 1.0])

    def dense(x: torch.Tensor, per_row: list[int]) -> torch.Tensor:
        out = torch.zeros(x.shape[0], N, dtype=torch.float64)
        for t, slot in enumerate(per_row):
            if slot >= 0:
                delta = x[t].double() @ a[slot].double().t() @ b[slot].double().t()
                out[t] = scales[slot].double() * delta
        return out

    decode = [2, -1, 0, 1, 0, -1, 2]
    x = torch.randn(len(decode), K, generator=gen)
    y = torch.zeros(len(decode), N)
    row.lora_bgmv(y, x, a, b, scales, torch.tensor(decode, dtype=torch.int32))
    assert rel_error(y, dense(x, decode)) < REL_TOL[torch.float32]

    lengths, seg_slots = [3, 0, 19, 4, 1], [1, 0, 2, -1, 0]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    per_row = [s for s, n in zip(seg_slots, lengths, strict=True) for _ in range(n)]
    x = torch.randn(starts[-1], K, generator=gen)
    y = torch.zeros(starts[-1], N)
    row.lora_sgmv(
        y,
        x,
        a,
        b,
        scales,
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(seg_slots, dtype=torch.int64),
        max(lengths),
    )
    assert rel_error(y, dense(x, per_row)) < REL_TOL[torch.float32]
