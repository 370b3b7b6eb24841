"""Fixtures: a real gateway (`create_app`) with the control plane, on each database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from control_plane_helpers import ControlPlane, control_plane


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        yield plane
