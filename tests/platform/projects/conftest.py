"""Fixtures: a real gateway (`create_app`) with the control plane, on each database."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "auth"))

from control_plane_helpers import ControlPlane, control_plane


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        yield plane
