"""`bench/gpu_kernels.py --smoke` runs end to end on the CPU interpreter (no GPU time wasted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_kernel_bench_smoke(tmp_path: Path) -> None:
    bench = load_script("gpu_kernels")
    results = bench.main(["--smoke", "--e2e", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "gpu_kernels.json").read_text())
    assert written["smoke"] is True
    assert all(row["rel_err"] < 2e-3 for row in results["decode_attention"])
    assert all(
        row["w4a16_rel_err"] < 2e-3 and row["w8a16_rel_err"] < 2e-3 for row in results["matmul"]
    )
    systems = {row["system"] for row in results["e2e"]["rows"]}
    assert "transformers" in systems


@pytest.mark.slow
def test_w4_probe_smoke(tmp_path: Path) -> None:
    """The probe's variants all run, and those that still compute the product match it."""
    rows = load_script("gpu_w4_probe").main(["--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_w4_probe.json").read_text()) == rows
    variants = {row["variant"] for row in rows if "us" in row}
    assert {"full", "prefetch_sz", "no_x", "no_scale", "load_only"} <= variants
    exact = [row for row in rows if "rel_err" in row]
    assert exact and all(row["rel_err"] < 2e-3 for row in exact)


@pytest.mark.slow
def test_gpu_decode_bench_smoke(tmp_path: Path) -> None:
    """The decode roofline bench runs on a tiny random model: every batch decodes every token,
    the roofline is above what the CPU reaches, int4 rows are compared with float."""
    rows = load_script("gpu_decode").main(["--smoke", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_decode.json").read_text())["rows"] == json.loads(
        json.dumps(rows, default=str)
    )
    assert not [row for row in rows if "error" in row]
    assert {(row["weights"], row["batch"]) for row in rows} == {
        (weights, batch) for weights in ("fp16", "int4") for batch in (1, 8, 64)
    }
    for row in rows:
        assert row["decode_steps"] == 5  # 6 new tokens, the first from the prefill step
        assert 0 < row["tokens_per_s"] < row["roofline_tokens_per_s"]
        assert row["prepare_ms"] > 0
        if row["weights"] == "int4":
            assert row["vs_fp16"] > 0
