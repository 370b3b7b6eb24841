"""`bench/gpu_kernels.py --smoke` runs end to end on the CPU interpreter (no GPU time wasted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_kernels.py"


@pytest.mark.slow
def test_gpu_kernel_bench_smoke(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_kernels_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.main(["--smoke", "--e2e", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "gpu_kernels.json").read_text())
    assert written["smoke"] is True
    assert all(row["rel_err"] < 2e-3 for row in results["decode_attention"])
    assert all(
        row["w4a16_rel_err"] < 2e-3 and row["w8a16_rel_err"] < 2e-3 for row in results["matmul"]
    )
    systems = {row["system"] for row in results["e2e"]["rows"]}
    assert "transformers" in systems
