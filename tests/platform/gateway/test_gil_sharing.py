"""`share_gil_with_engines`: the event loop waits for the GIL at most 0.5 ms, not Python's 5."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from hydrant.platform.services import GIL_SWITCH_INTERVAL_S, share_gil_with_engines


@pytest.fixture()
def restore_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("restore_interval")
def test_the_switch_interval_is_lowered_for_in_process_engines() -> None:
    sys.setswitchinterval(0.005)
    share_gil_with_engines()
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    assert GIL_SWITCH_INTERVAL_S < 0.005
