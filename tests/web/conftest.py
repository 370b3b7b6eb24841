"""Fixtures: the real gateway app (control plane + `/ui`) on each database backend."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

_PLATFORM_TESTS = Path(__file__).resolve().parents[1] / "platform"
sys.path.insert(0, str(_PLATFORM_TESTS / "auth"))
sys.path.insert(0, str(_PLATFORM_TESTS / "reports"))

from control_plane_helpers import ControlPlane, control_plane  # noqa: E402


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        plane.client.follow_redirects = False  # the tests look at each redirect
        yield plane
