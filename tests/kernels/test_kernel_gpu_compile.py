"""Every Triton kernel compiles for Hopper (sm_90) to a cubin, without a GPU.

The interpreter runs the kernels' arithmetic; this checks what only the GPU
compiler checks. It runs `gpu_compile_check.py` in a subprocess because this
test session interprets kernels (TRITON_INTERPRET=1 is set by conftest).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")


@pytest.mark.slow
def test_kernels_compile_for_hopper() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # silences Triton 3.9's default-change warning
    script = Path(__file__).with_name("gpu_compile_check.py")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok   ") == 17, done.stdout
