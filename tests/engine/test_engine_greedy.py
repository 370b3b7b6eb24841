"""Greedy generation through the whole engine is token-identical to transformers.

transformers' `generate(do_sample=False)` on each prompt alone is the
reference. The engine must reproduce it for one request, for 32 requests of
different lengths batched with chunked prefill, with prefix-cache hits, and
under a KV budget so small that sequences are preempted and recomputed:
batching, caching and preemption must never change a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from tiny_models import (
    EngineTracker,
    Family,
    build_tiny_model,
    hf_greedy,
    load_hf_model,
    random_prompts,
    run_to_completion,
)

from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.protocol import BACKGROUND_PRIORITY
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.scheduler import SchedulerOutput
from hydrant.engine.sequence import Request

NEW_TOKENS = 64
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
PARITY_FAMILIES: tuple[Family, ...] = ("llama", "qwen2", "qwen3", "mistral")


@dataclass
class Reference:
    model_dir: Path
    prompts: list[list[int]]
    outputs: list[list[int]]
    shared_prompts: list[list[int]]  # long common prefix, different tails
    shared_outputs: list[list[int]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=PARITY_FAMILIES)
def reference(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    family: Family = request.param
    model_dir = build_tiny_model(tmp_path_factory.mktemp(family), family, seed=7)
    hf = load_hf_model(model_dir)
    prompts = random_prompts(32, 1, 150, seed=11)
    prefix = random_prompts(1, 70, 71, seed=12)[0]
    shared = [prefix + tail for tail in random_prompts(6, 1, 30, seed=13)]
    shared.append(prefix[:64])  # exactly 4 full blocks: all cached, one block recomputed
    return Reference(
        model_dir=model_dir,
        prompts=prompts,
        outputs=[hf_greedy(hf, p, NEW_TOKENS) for p in prompts],
        shared_prompts=shared,
        shared_outputs=[hf_greedy(hf, p, NEW_TOKENS) for p in shared],
    )


def _generate(engine: LLMEngine, prompts: list[list[int]], tag: str = "r") -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"{tag}{i}", prompt, GREEDY))
    finals = run_to_completion(engine)
    for output in finals.values():
        assert output.outputs[0].finish_reason == "length"
    return [finals[f"{tag}{i}"].outputs[0].token_ids for i in range(len(prompts))]


def test_single_request_matches_transformers(reference: Reference, engines: EngineTracker) -> None:
    engine = engines.make(reference.model_dir)
    assert _generate(engine, reference.prompts[:1]) == reference.outputs[:1]


def test_batched_chunked_prefill_matches_transformers(
    reference: Reference, engines: EngineTracker
) -> None:
    engine = engines.make(
        reference.model_dir,
        kv_cache_bytes=1 << 24,
        max_num_batched_tokens=96,
        short_lane_tokens=96,
        long_lane_tokens=32,
    )
    mixed_steps = 0
    schedule = engine.scheduler.schedule

    def spy() -> SchedulerOutput:
        nonlocal mixed_steps
        out = schedule()
        sizes = [item.num_new_tokens for item in out.scheduled]
        mixed_steps += int(1 in sizes and any(n > 1 for n in sizes))
        return out

    engine.scheduler.schedule = spy
    assert _generate(engine, reference.prompts) == reference.outputs
    assert mixed_steps > 0  # prefill chunks really ran in the same forward as decodes
    assert engine.scheduler.num_preemptions == 0


def test_background_work_in_capped_steps_matches_transformers(
    reference: Reference, engines: EngineTracker
) -> None:
    """Batch lines (background, prompts chunked under `max_background_step_tokens`,
    paused whenever foreground requests arrive) answer what a request alone answers."""
    cap = 24
    engine = engines.make(
        reference.model_dir, kv_cache_bytes=1 << 24, max_background_step_tokens=cap
    )
    background_tokens: list[int] = []
    schedule = engine.scheduler.schedule

    def spy() -> SchedulerOutput:
        out = schedule()
        priorities = {item.seq.request.priority for item in out.scheduled}
        assert len(priorities) <= 1  # never background and foreground in one step
        if priorities == {BACKGROUND_PRIORITY}:
            background_tokens.append(out.num_batched_tokens)
        return out

    engine.scheduler.schedule = spy
    lines, urgent = reference.prompts[:8], reference.prompts[8:12]
    for i, prompt in enumerate(lines):
        engine.add_request(Request(f"b{i}", prompt, GREEDY, priority=BACKGROUND_PRIORITY))
    for _ in range(5):
        engine.step()
    for i, prompt in enumerate(urgent):
        engine.add_request(Request(f"a{i}", prompt, GREEDY))
    finals = run_to_completion(engine)
    assert [finals[f"b{i}"].outputs[0].token_ids for i in range(8)] == reference.outputs[:8]
    assert [finals[f"a{i}"].outputs[0].token_ids for i in range(4)] == reference.outputs[8:12]
    assert max(background_tokens) == cap  # the cap was reached, and held


def test_prefix_cache_hits_do_not_change_results(
    reference: Reference, engines: EngineTracker
) -> None:
    engine = engines.make(reference.model_dir)
    first = _generate(engine, reference.shared_prompts[:1], tag="first")
    assert first == reference.shared_outputs[:1]
    rest = reference.shared_prompts[1:]
    for i, prompt in enumerate(rest):
        engine.add_request(Request(f"s{i}", prompt, GREEDY))
    finals = run_to_completion(engine)
    assert [finals[f"s{i}"].outputs[0].token_ids for i in range(len(rest))] == (
        reference.shared_outputs[1:]
    )
    cached = [finals[f"s{i}"].metrics.cached_tokens for i in range(len(rest))]
    assert all(c >= 64 for c in cached[:-1])  # the 70-token prefix: 4 full blocks hit
    assert cached[-1] == 48  # a fully cached prompt recomputes its last block
    assert engine.stats().prefix_cache_hit_rate > 0.5


def test_preemption_does_not_change_results(reference: Reference, engines: EngineTracker) -> None:
    engine = engines.make(reference.model_dir, num_gpu_blocks=40)
    subset = reference.prompts[:16]
    assert _generate(engine, subset) == reference.outputs[:16]
    assert engine.scheduler.num_preemptions > 0


def test_preemption_without_prefix_caching(reference: Reference, engines: EngineTracker) -> None:
    engine = engines.make(reference.model_dir, num_gpu_blocks=32, enable_prefix_caching=False)
    subset = reference.prompts[16:28]
    assert _generate(engine, subset) == reference.outputs[16:28]
    assert engine.scheduler.num_preemptions > 0


def test_kernel_package_ops_give_the_same_tokens(
    reference: Reference, engines: EngineTracker
) -> None:
    """The kernel package's own choice (its references here, Triton on CUDA) is a drop-in."""
    engine = engines.make(reference.model_dir, kernels="hydrant")
    assert engine.runner.model.ops.name == "reference"
    assert _generate(engine, reference.prompts[:6]) == reference.outputs[:6]
