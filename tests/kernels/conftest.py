"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

`TRITON_INTERPRET` is read when a kernel is decorated with `@triton.jit`, i.e.
when a launcher module (`hydrant.kernels.decode_attention`, ...) is first
imported. This conftest is imported at collection, before any test module
here, and nothing outside `hydrant.kernels`' launchers decorates kernels, so
setting it here, first thing, is early enough (and a value given on the
command line wins).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture()
def gen() -> torch.Generator:
    """A seeded generator: every test draws fresh but reproducible random inputs."""
    return torch.Generator().manual_seed(1234)
