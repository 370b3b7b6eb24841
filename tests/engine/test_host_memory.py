"""The CPU engine's host memory: the KV cache's lazily zeroed maps, and malloc keeping
freed activations for the next step (`retain_freed_memory`).

The allocator test runs in a child interpreter: the setting is process-wide and would
otherwise change this test process's malloc for every test after it. It reads glibc's
own accounting (`mallinfo2`: bytes in mmap'd blocks, bytes of the heap), not timings.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from hydrant.engine.host_memory import zero_mapped_tensor

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt/mallinfo2 are glibc's",
)

# Thirty steps, each allocating (and filling) a 16 MiB and a 64 MiB tensor and freeing
# both, as a step's activations are; glibc's accounting and the small block's address at
# each step.
_PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    import torch
    from hydrant.engine.host_memory import retain_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    retained = retain_freed_memory() if sys.argv[1] == "retain" else None
    steps = []
    for _ in range(30):
        small = torch.empty(4 << 20, dtype=torch.float32).fill_(1.0)
        large = torch.empty(16 << 20, dtype=torch.float32).fill_(1.0)
        info = libc.mallinfo2()
        steps.append({"mapped": info.hblkhd, "heap": info.arena, "small": small.data_ptr()})
        del small, large
    print(json.dumps({"retained": retained, "steps": steps}))
    """
)
MIB = 1 << 20


def _probe(mode: str) -> tuple[object, list[dict[str, int]]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["retained"], result["steps"]


@glibc
def test_retained_memory_keeps_small_activations_on_the_heap_and_large_ones_mapped() -> None:
    _, plain = _probe("plain")
    # glibc's default: the first 16 MiB block is a map of its own too (faulted in each time)
    assert plain[0]["mapped"] >= 80 * MIB

    retained, steps = _probe("retain")
    assert retained is True
    first = steps[0]
    assert 64 * MIB <= first["mapped"] < 80 * MIB  # the 64 MiB block only: its own map
    assert first["heap"] >= 16 * MIB  # the 16 MiB one from the heap at once
    # the heap settles: later steps reuse the blocks earlier steps freed
    assert steps[-1]["heap"] == steps[15]["heap"] <= 20 * 16 * MIB
    assert len({step["small"] for step in steps[-10:]}) == 1
    assert all(step["mapped"] < 80 * MIB for step in steps)


def test_zero_mapped_tensors_read_zero_and_write_through() -> None:
    big = zero_mapped_tensor((512, 1024), torch.float32)  # 2 MiB: its own map
    small = zero_mapped_tensor((4, 4), torch.float32)  # below MIN_MAPPED_BYTES: torch.zeros
    for tensor in (big, small):
        assert not tensor.any()
        tensor[1, 2] = 3.0
        assert float(tensor.sum()) == 3.0
