"""The worker's GIL switch interval: the measured default, an override only when it is a
positive number of milliseconds (a typo must not leave a worker at some odd interval)."""

from __future__ import annotations

import pytest

from hydrant.engine.worker.process import (
    SWITCH_INTERVAL_ENV,
    WORKER_SWITCH_INTERVAL_S,
    switch_interval_s,
)


def test_default_is_below_pythons_five_milliseconds() -> None:
    assert switch_interval_s({}) == WORKER_SWITCH_INTERVAL_S < 0.005


@pytest.mark.parametrize(("raw", "expected"), [("5", 0.005), (" 0.25 ", 0.00025), ("2", 0.002)])
def test_a_positive_override_in_milliseconds(raw: str, expected: float) -> None:
    assert switch_interval_s({SWITCH_INTERVAL_ENV: raw}) == pytest.approx(expected)


@pytest.mark.parametrize("raw", ["", "0", "-1", "fast", "nan"])
def test_anything_else_keeps_the_default(raw: str) -> None:
    assert switch_interval_s({SWITCH_INTERVAL_ENV: raw}) == WORKER_SWITCH_INTERVAL_S
