"""The dispatcher runs on CPU-only API nodes: nothing it imports may pull in torch."""

from __future__ import annotations

import subprocess
import sys


def test_dispatch_and_the_worker_wire_format_never_import_torch() -> None:
    code = (
        "import sys, hydrant.platform.dispatch.service, hydrant.platform.dispatch.controllers,"
        " hydrant.platform.dispatch.kubernetes, hydrant.engine.worker.wire;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
