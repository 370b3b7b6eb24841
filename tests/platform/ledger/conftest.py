"""The ledger tests reuse the e2e TCP proxy (`tests/e2e/tcp_proxy.py`) to stall a database."""

from __future__ import annotations

import sys
from pathlib import Path

_E2E = str(Path(__file__).resolve().parents[2] / "e2e")
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)
