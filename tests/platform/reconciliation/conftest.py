"""The report factories (ledger rows), the control plane and web helpers on sys.path."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))  # report_factories
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "auth"))  # control_plane_helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "web"))  # web_helpers

from control_plane_helpers import ControlPlane, control_plane


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        yield plane
