"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

`TRITON_INTERPRET` is read when a kernel is decorated with `@triton.jit`, i.e.
when a launcher module (`hydrant.kernels.decode_attention`, ...) is first
imported; `hydrant.kernels.ops` imports them lazily. The root conftest sets
it for the whole session on machines without a GPU; this repeats it (a
no-op then) so `pytest tests/kernels` run from anywhere is interpreted too.
A value given on the command line wins.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Tiny ops on a shared 2-core machine run up to 10x faster on one thread (no
    oversubscription); restored after each module so other folders keep their setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture()
def gen() -> torch.Generator:
    """A seeded generator: every test draws fresh but reproducible random inputs."""
    return torch.Generator().manual_seed(1234)
