"""A worker process keeps its loaded heap out of GC scans (hydrant/heap.py), and gives it back
before unloading, so a dropped model's reference cycles can still be collected.

Run in a child interpreter: freezing the heap of the test process itself would keep
every other test's garbage cycles alive.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, sys
    import torch
    from hydrant.engine.worker.runtime import WorkerOptions, WorkerRuntime

    torch.set_num_threads(1)

    async def main(freeze):
        options = WorkerOptions(
            model="tiny", path=sys.argv[1], secret="s", kv_cache_bytes=1 << 22, freeze_heap=freeze
        )
        runtime = WorkerRuntime(options)
        await runtime.load()
        loaded = gc.get_freeze_count()
        engine = runtime.engine.engine  # the model's modules are among the frozen objects
        module_frozen = gc.is_tracked(engine.runner) and engine.runner not in gc.get_objects()
        del engine
        await runtime.unload()
        print(loaded, int(module_frozen), gc.get_freeze_count())

    asyncio.run(main(sys.argv[2] == "1"))
    """
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "llama", seed=5)


def _run(model_dir: Path, freeze: bool) -> list[int]:
    done = subprocess.run(  # our interpreter, our script
        [sys.executable, "-c", SCRIPT, str(model_dir), "1" if freeze else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [int(word) for word in done.stdout.split()]


def test_a_worker_freezes_its_heap_once_loaded_and_thaws_it_to_unload(model_dir: Path) -> None:
    loaded, module_frozen, after_unload = _run(model_dir, freeze=True)
    assert loaded > 10_000  # torch, the engine, the model: far more than a few objects
    assert module_frozen == 1  # the model runner is no longer in the collected generations
    assert after_unload == 0


def test_a_runtime_in_someone_elses_process_leaves_the_heap_alone(model_dir: Path) -> None:
    loaded, module_frozen, after_unload = _run(model_dir, freeze=False)
    assert (loaded, module_frozen, after_unload) == (0, 0, 0)
