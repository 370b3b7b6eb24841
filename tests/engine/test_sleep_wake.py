"""Sleep mode: KV freed while asleep, work refused, token-identical output after a wake
that reads no file, and a sleep that waits for the requests already running."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import (
    EngineTracker,
    assert_no_kv_leak,
    build_tiny_model,
    random_prompts,
    run_to_completion,
)

from hydrant.engine import loader, safetensors_reader
from hydrant.engine.async_engine import running
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.model_runner import ModelRunner
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request
from hydrant.engine.sleep_mode import EngineBusyError, EngineSleepingError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "gqa", seed=11)


def _greedy(engine: LLMEngine, prompts: list[list[int]], tag: str) -> dict[int, list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"{tag}{i}", prompt, GREEDY))
    finals = run_to_completion(engine)
    return {i: list(finals[f"{tag}{i}"].outputs[0].token_ids) for i in range(len(prompts))}


def _runner(engine: LLMEngine) -> ModelRunner:
    assert isinstance(engine.runner, ModelRunner)
    return engine.runner


def test_sleep_frees_kv_refuses_work_and_wake_restores_the_same_pool(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    runner = _runner(engine)
    prompts = random_prompts(3, 5, 40, seed=3)
    before = _greedy(engine, prompts, "a")
    blocks, kv_bytes = engine.scheduler.block_manager.num_blocks, runner.kv_cache_bytes
    assert kv_bytes > 0

    engine.sleep()
    assert engine.is_sleeping
    assert runner.kv_caches == [] and runner.kv_cache_bytes == 0
    stats = engine.stats()
    assert stats.num_total_blocks == 0 and stats.num_free_blocks == 0
    with pytest.raises(EngineSleepingError, match="asleep"):
        engine.add_request(Request("refused", [1, 2, 3], GREEDY))
    assert not engine.has_unfinished()  # the refused request left no trace
    assert engine.step() == []
    engine.sleep()  # idempotent

    engine.wake()
    assert not engine.is_sleeping
    assert engine.scheduler.block_manager.num_blocks == blocks
    assert runner.kv_cache_bytes == kv_bytes
    assert all(not k.any() and not v.any() for k, v in runner.kv_caches)  # a clean cache
    assert engine.stats().num_total_blocks == blocks
    assert _greedy(engine, prompts, "b") == before
    assert_no_kv_leak(engine)


def test_wake_forgets_the_prefix_cache(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    prompt = random_prompts(1, 70, 71, seed=8)[0]  # several full blocks
    engine.add_request(Request("first", prompt, GREEDY))
    first = run_to_completion(engine)["first"]
    engine.add_request(Request("again", prompt, GREEDY))
    again = run_to_completion(engine)["again"]
    assert again.metrics.cached_tokens > 0  # the prefix cache works before sleeping

    engine.sleep()
    engine.wake()
    engine.add_request(Request("after", prompt, GREEDY))
    after = run_to_completion(engine)["after"]
    assert after.metrics.cached_tokens == 0  # the zeroed cache offers no stale prefix
    assert after.outputs[0].token_ids == first.outputs[0].token_ids


def test_wake_reads_no_checkpoint_file(
    model_dir: Path, tmp_path: Path, engines: EngineTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved = shutil.copytree(model_dir, tmp_path / "ckpt")
    engine = engines.make(moved)
    prompts = random_prompts(2, 5, 30, seed=5)
    before = _greedy(engine, prompts, "a")
    engine.sleep()

    shutil.rmtree(moved)  # the checkpoint is gone from disk
    opened: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        raise AssertionError("wake must not read the checkpoint")

    monkeypatch.setattr(loader, "SafetensorsFile", refuse)
    monkeypatch.setattr(safetensors_reader, "SafetensorsFile", refuse)
    monkeypatch.setattr("safetensors.safe_open", refuse)
    engine.wake()
    assert opened == []
    assert _greedy(engine, prompts, "b") == before


def test_loaded_weights_do_not_map_the_checkpoint(
    model_dir: Path, tmp_path: Path, engines: EngineTracker
) -> None:
    """The loader copies weights out of the memory map: nothing of the file stays mapped."""
    copy = shutil.copytree(model_dir, tmp_path / "mapped")
    engine = engines.make(copy)
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps")
    weights = str(copy / "model.safetensors")
    assert weights not in maps.read_text()
    assert run_to_completion(engine) == {}


def test_sync_sleep_refuses_while_requests_are_unfinished(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    engine.add_request(Request("busy", [4, 5, 6], GREEDY))
    with pytest.raises(EngineBusyError, match="unfinished"):
        engine.sleep()
    assert not engine.is_sleeping
    run_to_completion(engine)
    engine.sleep()
    assert engine.is_sleeping
    engine.wake()


def test_load_and_wake_reports_time_each_phase(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    report = engine.load_report
    assert report is not None and report.kind == "load"
    for phase in ("config", "tokenizer", "build_meta", "read_weights", "assign", "kv_allocate"):
        assert phase in report.phases, phase
    assert all(seconds >= 0 for seconds in report.phases.values())
    assert report.total_seconds >= max(report.phases.values())
    assert set(report.as_dict()) == {*report.phases, "total"}
    assert engine.wake_report is None
    engine.sleep()
    engine.wake()
    wake = engine.wake_report
    assert wake is not None and wake.kind == "wake"
    assert "kv_allocate" in wake.phases and "read_weights" not in wake.phases


async def _collect(stream: Any) -> list[RequestOutput]:
    return [output async for output in stream]


async def test_async_sleep_waits_for_running_requests(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompts = random_prompts(3, 5, 30, seed=9)
    reference = engines.make(model_dir)
    for i, prompt in enumerate(prompts):
        reference.add_request(Request(str(i), prompt, LONG))
    expected = {k: v.outputs[0].token_ids for k, v in run_to_completion(reference).items()}

    async with running(engine) as front:
        first_output = asyncio.Event()

        async def stream(i: int) -> list[RequestOutput]:
            outputs = []
            async for output in front.generate(Request(str(i), prompts[i], LONG)):
                outputs.append(output)
                first_output.set()
            return outputs

        tasks = [asyncio.create_task(stream(i)) for i in range(len(prompts))]
        await first_output.wait()
        await front.sleep()
        # sleep returned only after every running request had finished in full
        assert all(task.done() for task in tasks)
        for i, task in enumerate(tasks):
            outputs = task.result()
            assert outputs[-1].finished
            assert outputs[-1].outputs[0].finish_reason == "length"
            assert outputs[-1].outputs[0].token_ids == expected[str(i)]
        assert front.is_sleeping and engine.is_sleeping
        assert _runner(engine).kv_cache_bytes == 0
        with pytest.raises(EngineSleepingError):
            await _collect(front.generate(Request("late", [1, 2, 3], GREEDY)))
        await front.sleep()  # idempotent

        await front.wake()
        assert not front.is_sleeping and not engine.is_sleeping
        again = await _collect(front.generate(Request("0-again", prompts[0], LONG)))
        assert again[-1].outputs[0].token_ids == expected["0"]
        await front.wake()  # idempotent
    assert_no_kv_leak(engine)


async def test_cancelled_sleep_keeps_the_engine_serving(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        started = asyncio.Event()

        async def stream() -> list[RequestOutput]:
            outputs = []
            async for output in front.generate(Request("long", [7, 8, 9], LONG)):
                outputs.append(output)
                started.set()
            return outputs

        task = asyncio.create_task(stream())
        await started.wait()
        sleeper = asyncio.create_task(front.sleep())
        await asyncio.sleep(0)
        assert front.is_sleeping  # refusing from the moment sleep() began
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert not front.is_sleeping and not engine.is_sleeping
        assert (await task)[-1].finished
        assert (await _collect(front.generate(Request("next", [1, 2], GREEDY))))[-1].finished


def test_load_is_logged_as_one_structured_record(
    model_dir: Path, engines: EngineTracker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="hydrant.engine.llm_engine"):
        engine = engines.make(model_dir)
    records = [r for r in caplog.records if getattr(r, "event", None) == "engine_load"]
    assert len(records) == 1
    fields = vars(records[0])
    assert fields["phase_read_weights_s"] >= 0
    assert fields["phase_total_s"] == pytest.approx(engine.load_report.total_seconds, abs=1e-5)  # type: ignore[union-attr]
    assert str(model_dir) not in records[0].getMessage()  # no paths in the record


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sleep_moves_weights_to_pinned_host_and_frees_the_device(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir, device="cuda")
    runner = _runner(engine)
    prompts = random_prompts(2, 5, 30, seed=13)
    before = _greedy(engine, prompts, "a")
    torch.cuda.synchronize()
    used_awake = torch.cuda.memory_allocated()
    engine.sleep()
    params = list(runner.model.parameters())
    assert all(p.device.type == "cpu" and p.is_pinned() for p in params)
    assert torch.cuda.memory_allocated() < used_awake / 10
    engine.wake()
    assert all(p.device.type == "cuda" for p in runner.model.parameters())
    assert [id(p) for p in runner.model.parameters()] == [id(p) for p in params]
    assert _greedy(engine, prompts, "b") == before


async def test_sleep_cancelled_while_the_engine_thread_sleeps_stays_consistent(
    model_dir: Path, engines: EngineTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engines.make(model_dir)
    runner = _runner(engine)
    entered, release = threading.Event(), threading.Event()
    real_sleep = runner.sleep

    def slow_sleep() -> None:
        entered.set()
        release.wait(10)
        real_sleep()

    monkeypatch.setattr(runner, "sleep", slow_sleep)
    async with running(engine) as front:
        sleeper = asyncio.create_task(front.sleep())
        while not entered.is_set():
            await asyncio.sleep(0.001)
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert front.is_sleeping  # the thread is putting it to sleep: no new work
        release.set()
        for _ in range(1000):
            if engine.is_sleeping:
                break
            await asyncio.sleep(0.005)
        assert engine.is_sleeping
        await front.wake()
        assert not front.is_sleeping
        assert (await _collect(front.generate(Request("after", [1, 2], GREEDY))))[-1].finished
