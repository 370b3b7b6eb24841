"""Backend choice of the by-name ops, and argument validation before any work."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hydrant.kernels import backends, ops, reference
from hydrant.kernels.errors import KernelArgumentError, KernelBackendError


def test_without_a_name_the_device_picks_reference_on_cpu_and_triton_on_cuda() -> None:
    assert backends.for_device(torch.device("cpu")).name == "reference"
    assert backends.for_device(torch.device("cuda", 0)).name == "triton"


def test_no_environment_variable_or_process_setting_chooses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The per-call `HYDRANT_KERNELS` lookup and the process-wide `set_backend` are gone:
    the argument names the row, or the device picks it."""
    calls: list[str] = []
    real = reference.silu_and_mul

    def spy(x: torch.Tensor) -> torch.Tensor:
        calls.append("ref")
        return real(x)

    monkeypatch.setattr(reference, "silu_and_mul", spy)
    monkeypatch.setenv("HYDRANT_KERNELS", "triton")
    ops.silu_and_mul(torch.randn(2, 4))
    assert calls == ["ref"]
    assert not hasattr(backends, "set_backend") and not hasattr(ops, "set_backend")


def test_invalid_backend_names_are_refused() -> None:
    with pytest.raises(KernelArgumentError, match="not a kernel backend"):
        backends.get_backend("cuda")
    with pytest.raises(KernelArgumentError, match="'fast' is not a kernel backend"):
        ops.silu_and_mul(torch.ones(2, 4), backend="fast")


def test_the_backend_argument_routes_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = reference.silu_and_mul

    def spy(x: torch.Tensor) -> torch.Tensor:
        calls.append("ref")
        return real(x)

    monkeypatch.setattr(reference, "silu_and_mul", spy)
    x = torch.randn(3, 8)
    ops.silu_and_mul(x)
    assert calls == ["ref"]
    pytest.importorskip("triton")
    out = ops.silu_and_mul(x, backend="triton")  # interpreted Triton: the reference is not called
    assert calls == ["ref"] and torch.allclose(out, real(x), atol=1e-6)


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    from hydrant.kernels import triton_support

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelBackendError, match="cannot run on cpu"):
        triton_support.check_triton_device(torch.device("cpu"))


def test_importing_ops_does_not_import_triton() -> None:
    code = (
        "import sys, hydrant.kernels.ops, hydrant.kernels.quantization; "
        "print('triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("which", ["reference", "triton"])
def test_both_backends_validate_identically(which: backends.BackendName) -> None:
    if which == "triton":
        pytest.importorskip("triton")
    q = torch.randn(2, 6, 64)
    cache = torch.zeros(4, 16, 4, 64)
    tables = torch.zeros(2, 2, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(KernelArgumentError, match="not a multiple of the cache's 4 KV heads"):
        ops.paged_decode_attention(q, cache, cache, tables, lens, 1.0, backend=which)
    with pytest.raises(KernelArgumentError, match=r"block_tables has dtype torch\.float32"):
        ops.paged_decode_attention(
            torch.randn(2, 8, 64), cache, cache, tables.float(), lens, 1.0, backend=which
        )
    with pytest.raises(KernelArgumentError, match=r"cu_seqlens_q has 2 entries"):
        ops.paged_prefill_attention(
            torch.randn(3, 8, 64),
            cache,
            cache,
            tables,
            torch.tensor([0, 3], dtype=torch.int32),
            lens,
            1.0,
            backend=which,
        )
    with pytest.raises(KernelArgumentError, match="weight shape"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6, backend=which)
    with pytest.raises(KernelArgumentError, match="must be even"):
        ops.silu_and_mul(torch.randn(2, 7), backend=which)
    with pytest.raises(KernelArgumentError, match="at most head_dim"):
        ops.rotary_embedding(
            torch.zeros(2, dtype=torch.int64),
            torch.randn(2, 2, 8),
            torch.randn(2, 1, 8),
            torch.randn(10, 16),
            backend=which,
        )
    with pytest.raises(KernelArgumentError, match="different devices"):
        ops.w8a16_matmul(
            torch.randn(2, 8),
            torch.zeros(4, 8, dtype=torch.int8),
            torch.ones(4, device="meta"),
            backend=which,
        )
