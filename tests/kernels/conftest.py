"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

`TRITON_INTERPRET` is read when a kernel is decorated with `@triton.jit`, i.e.
when a launcher module (`hydrant.kernels.decode_attention`, ...) is first
imported; `hydrant.kernels.ops` imports them lazily. The root conftest sets
it for the whole session on machines without a GPU; this repeats it (a
no-op then) so `pytest tests/kernels` run from anywhere is interpreted too.
A value given on the command line wins.
"""

from __future__ import annotations

import ctypes
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


# extra compiler flags per build of the C kernels: None is the engine's own library
NATIVE_BUILDS: dict[str, list[str] | None] = {
    "native": None,
    "avx2": ["-mno-avx512f"],
    "portable": ["-mno-avx2"],
}


@pytest.fixture(scope="module", params=list(NATIVE_BUILDS))
def native_build(request: pytest.FixtureRequest) -> ctypes.CDLL | None:
    """Each build of the C kernels: the engine's (None), then with x86 features switched
    off, so an AVX-512 host checks the AVX2+FMA paths (EPYCs before Zen 4) and the
    portable loops as well."""
    from hydrant.kernels.cpu import native_decode

    flags = NATIVE_BUILDS[request.param]
    if flags is None:
        return None
    if not {"avx2", "fma"} <= set(native_decode._cpu_flags().split()):
        pytest.skip("no AVX2+FMA here: this build switches x86 SIMD features off a CPU with them")
    return native_decode.open_library(native_decode.build(extra=flags))
