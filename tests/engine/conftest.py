"""Fixtures the engine tests share: one torch thread, and a KV-leak check after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from tiny_models import EngineTracker


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: batched and solo runs then reduce in the same order (and the
    two cores stay free for the other test processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def engines() -> Iterator[EngineTracker]:
    """Engines a test builds; after it, every one must have all its KV blocks back."""
    tracker = EngineTracker()
    yield tracker
    tracker.check()
