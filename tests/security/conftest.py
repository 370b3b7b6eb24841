"""Security tests reuse the e2e server launcher (`tests/e2e/hydrant_server.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

_E2E = str(Path(__file__).resolve().parents[1] / "e2e")
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)

_AUTH = str(Path(__file__).resolve().parents[1] / "platform" / "auth")  # control_plane_helpers
if _AUTH not in sys.path:
    sys.path.insert(0, _AUTH)
