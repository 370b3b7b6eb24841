"""The kernel-backend table: one contract suite over every row, and what each row declares.

Every row (`triton`, `reference`, both `cpu` variants) runs every op of
`OPS` on the same inputs and must agree with the references; a row claiming
`kv_int8` must do so on int8 caches too. A feature a row claims has its ops; one
it lacks is refused by name. Caches hold finite garbage outside each context
(the CPU's padded SDPA multiplies masked slots by zero, which NaN would
survive), so an out-of-context read still shows as a large error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import REL_TOL, PagedKV, make_paged_kv, rel_error
from torch import nn

from hydrant.kernels import reference
from hydrant.kernels.backends import BACKEND_NAMES, get_backend
from hydrant.kernels.cpu.backend import NATIVE, PLANNED
from hydrant.kernels.errors import KernelBackendError
from hydrant.kernels.quantization.rtn import quantize_int4_groupwise, quantize_int8_per_channel
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.rope_cache import build_rope_cache
from hydrant.kernels.table import FEATURE_OPS, FEATURES, OPS, Feature, KernelBackend
from hydrant.kernels.triton_backend import TRITON, triton_interpreter_enabled

ROWS = {"triton": TRITON, "reference": REFERENCE, "cpu-native": NATIVE, "cpu-planned": PLANNED}
KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
BLOCK, HEADS, KV_HEADS, HEAD_DIM = 8, 4, 2, 32
LENS = [1, BLOCK, BLOCK + 3, 21]
TOL = REL_TOL[torch.float32]


@pytest.fixture(params=list(ROWS))
def row(request: pytest.FixtureRequest) -> KernelBackend:
    backend = ROWS[request.param]
    if backend is TRITON:
        pytest.importorskip("triton")
        if not triton_interpreter_enabled():
            pytest.skip("the Triton kernels on the CPU need TRITON_INTERPRET=1")
    return backend


def _kv(gen: torch.Generator, int8: bool) -> PagedKV:
    kv = make_paged_kv(LENS, KV_HEADS, HEAD_DIM, BLOCK, torch.float32, gen, int8=int8)
    if int8:
        assert kv.k_scale is not None and kv.v_scale is not None
        kv.k_scale.nan_to_num_(nan=0.5)
        kv.v_scale.nan_to_num_(nan=0.5)
    else:
        kv.k_cache.nan_to_num_(nan=40.0)
        kv.v_cache.nan_to_num_(nan=-40.0)
    return kv


def _int8_cases(row: KernelBackend) -> list[bool]:
    return [False, True] if row.has("kv_int8") else [False]


def test_the_table_holds_every_named_row() -> None:
    assert {get_backend(name).name for name in BACKEND_NAMES} == set(BACKEND_NAMES)
    assert get_backend("cpu", torch.bfloat16) is PLANNED
    for backend in ROWS.values():
        assert all(callable(getattr(backend, op)) for op in OPS)


def test_write_kv(row: KernelBackend, gen: torch.Generator) -> None:
    for int8 in _int8_cases(row):
        key = torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen)
        value = torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen)
        slots = torch.tensor([3, -1, 17, 8, 30])
        outs = []
        for write in (row.write_kv, reference.write_kv):
            dtype = torch.int8 if int8 else torch.float32
            caches = [torch.zeros(4, BLOCK, KV_HEADS, HEAD_DIM, dtype=dtype) for _ in range(2)]
            scales = [torch.zeros(4, BLOCK, KV_HEADS) for _ in range(2)] if int8 else [None, None]
            write(key, value, caches[0], caches[1], slots, scales[0], scales[1])
            outs.append([t for t in (*caches, *scales) if t is not None])
        for ours, theirs in zip(*outs, strict=True):
            assert torch.equal(ours, theirs), f"int8={int8}"


def test_decode_attention(row: KernelBackend, gen: torch.Generator) -> None:
    for int8 in _int8_cases(row):
        kv = _kv(gen, int8)
        q = torch.randn(len(LENS), HEADS, HEAD_DIM, generator=gen)
        args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.2)
        out = row.paged_decode_attention(*args, **kv.scales)
        assert rel_error(out, reference.paged_decode_attention(*args, **kv.scales)) < TOL


def test_prefill_attention(row: KernelBackend, gen: torch.Generator) -> None:
    q_lens = [1, 5, 4, 21]  # whole prompts and chunks after cached context
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    for int8 in _int8_cases(row):
        kv = _kv(gen, int8)
        q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, generator=gen)
        args = (q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 0.2)
        out = row.paged_prefill_attention(*args, max(q_lens), **kv.scales)
        assert rel_error(out, reference.paged_prefill_attention(*args, **kv.scales)) < TOL


def test_elementwise_ops(row: KernelBackend, gen: torch.Generator) -> None:
    x, residual = torch.randn(6, 64, generator=gen), torch.randn(6, 64, generator=gen)
    weight = 1 + 0.1 * torch.randn(64, generator=gen)
    for res in (None, residual):
        normed, summed = row.rms_norm(x, weight, 1e-5, res)
        want_normed, want_summed = reference.rms_norm(x, weight, 1e-5, res)
        assert rel_error(normed, want_normed) < TOL and rel_error(summed, want_summed) < TOL
    table = build_rope_cache(HEAD_DIM, 64, 10000.0, None, torch.float32, "cpu")
    positions = torch.tensor([0, 3, 63, 7])
    q = torch.randn(4, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(4, KV_HEADS, HEAD_DIM, generator=gen)
    for ours, theirs in zip(
        row.rotary_embedding(positions, q, k, table),
        reference.rotary_embedding(positions, q, k, table),
        strict=True,
    ):
        assert rel_error(ours, theirs) < TOL
    gate_up = torch.randn(5, 2 * 48, generator=gen)
    assert rel_error(row.silu_and_mul(gate_up), reference.silu_and_mul(gate_up)) < TOL


def test_weight_only_matmuls(row: KernelBackend, gen: torch.Generator) -> None:
    weight = torch.randn(48, 256, generator=gen)
    for m in (1, 5):
        x = torch.randn(m, 256, generator=gen)
        q8, s8 = quantize_int8_per_channel(weight, torch.float32)
        got8 = row.w8a16_matmul(x, q8, s8)
        assert rel_error(got8, reference.w8a16_matmul(x, q8, s8)) < TOL
        q4, s4, z4 = quantize_int4_groupwise(weight, 128, torch.float32)
        got4 = row.w4a16_matmul(x, q4, s4, z4, 128)
        assert rel_error(got4, reference.w4a16_matmul(x, q4, s4, z4, 128)) < TOL


@pytest.mark.parametrize("feature", FEATURES)
def test_each_feature_is_declared_with_its_ops_or_refused(
    row: KernelBackend, feature: Feature
) -> None:
    ops = FEATURE_OPS[feature]
    if row.has(feature):
        row.require(feature)
        assert all(callable(getattr(row, op)) for op in ops)
        return
    assert all(getattr(row, op) is None for op in ops)
    with pytest.raises(KernelBackendError, match=f"the {row.name} kernel backend has no"):
        row.require(feature)
    if feature == "planned_decode":
        with pytest.raises(KernelBackendError, match="planned_decode"):
            row.planner()
        with pytest.raises(KernelBackendError, match="planned_decode"):
            row.planned()


def test_what_each_row_declares() -> None:
    assert TRITON.features == {"kv_int8", "graph_capture"}
    assert REFERENCE.features == {"kv_int8"}
    assert NATIVE.features == {"kv_int8", "fast_linears"}
    assert PLANNED.features == {"kv_int8", "planned_decode"}


def test_planned_decode_equals_the_unplanned_op(gen: torch.Generator) -> None:
    kv = _kv(gen, int8=False)
    q = torch.randn(len(LENS), HEADS, HEAD_DIM, generator=gen)
    planner = PLANNED.planner()(BLOCK, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    plan = planner(kv.block_tables.tolist(), kv.context_lens.tolist())
    planned = PLANNED.planned()(q, kv.k_cache, kv.v_cache, plan, 0.2)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.2)
    assert rel_error(planned, PLANNED.paged_decode_attention(*args)) < 1e-6


def test_fast_linears_keep_the_results() -> None:
    linear_for: Callable[[torch.Tensor], Callable[..., torch.Tensor]] | None = NATIVE.linear_for
    assert linear_for is not None and NATIVE.optimize_linears is not None
    big, small = nn.Linear(1024, 1024), nn.Linear(16, 16)
    model = nn.Sequential(big, small)
    x = torch.randn(3, 1024)
    plain = big.weight.detach().clone()
    with torch.inference_mode():
        expected = big(x)
        NATIVE.optimize_linears(model)
        assert torch.allclose(big(x), expected, atol=1e-4)
        head = linear_for(big.weight)  # the LM head gets the weight as bound (maybe packed)
        assert torch.allclose(head(x, big.weight), F.linear(x, plain), atol=1e-4)
    assert type(small) is nn.Linear  # small: left on F.linear


def test_a_half_declared_feature_is_refused() -> None:
    with pytest.raises(KernelBackendError, match="claims 'planned_decode' but lacks"):
        dataclasses.replace(REFERENCE, features=frozenset({"kv_int8", "planned_decode"}))
    with pytest.raises(KernelBackendError, match="does not claim 'fast_linears' but sets"):
        dataclasses.replace(PLANNED, linear_for=NATIVE.linear_for)


def test_kernels_never_import_the_engine() -> None:
    """Dependency direction: engine -> kernels, never back."""
    offenders = [
        str(path.relative_to(KERNELS_DIR))
        for path in KERNELS_DIR.rglob("*.py")
        if re.search(r"^\s*(from|import)\s+hydrant\.engine\b", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []
