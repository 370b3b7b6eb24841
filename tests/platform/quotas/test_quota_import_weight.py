"""The control-plane core (keys, quotas, billing, ledger) never pulls in torch or the engine."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "hydrant.platform.keys",
    "hydrant.platform.quotas",
    "hydrant.platform.quotas.redis_backend",
    "hydrant.platform.billing",
    "hydrant.platform.ledger",
]


def test_importing_the_core_loads_no_torch() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in MODULES)
        + "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'triton'}"
        + " or m.startswith('hydrant.engine'))\n"
        + "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""
