"""LoRA adapters through the whole engine, against transformers + peft with the adapter merged.

What each test shows: an adapter alone gives the merged model's logits (within 1e-4) and
greedy tokens, for several ranks and target sets (rsLoRA included); one batch mixing
the base model and three adapters gives every row what it gets alone; the prefix cache
never hands one adapter's K/V to another (or to the base model) but does reuse an
adapter's own; preemption by recompute (prefix caching on) keeps each request's adapter
and still gives the merged model's tokens and logits; base-model rows
are bit for bit what an engine that never saw an adapter computes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lora_models import (
    ATTENTION,
    MLP,
    AdapterSpec,
    build_adapter,
    merged_model,
    record_logits,
    reference_logits,
)
from tiny_models import EngineTracker, build_tiny_model, hf_greedy, random_prompts

from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.protocol import AdapterRef
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request
from hydrant.kernels.triton_backend import triton_interpreter_enabled

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOLERANCE = 1e-4
NEW_TOKENS = 6
SPECS = {
    "qv-r8": AdapterSpec(8, 16, ("q_proj", "v_proj")),
    "all-r4-rslora": AdapterSpec(4, 8, ATTENTION + MLP, rslora=True),
    "mlp-o-r16": AdapterSpec(16, 8, ("o_proj", *MLP)),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("base") / "llama", "llama")


@pytest.fixture(scope="module")
def adapters(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, AdapterRef]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: build_adapter(base, root / name, spec, seed)
        for seed, (name, spec) in enumerate(SPECS.items())
    }


def _submit(
    engine: LLMEngine, rid: str, prompt: list[int], adapter: AdapterRef | None, tokens: int
) -> None:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(Request(rid, prompt, params, adapter=adapter))


def _drain(engine: LLMEngine) -> dict[str, RequestOutput]:
    finals: dict[str, RequestOutput] = {}
    for _ in range(2000):
        if not engine.has_unfinished():
            return finals
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    raise AssertionError("the engine did not drain")


def _tokens(output: RequestOutput) -> list[int]:
    return output.outputs[0].token_ids


def _check_against_merged(
    base: Path,
    ref: AdapterRef | None,
    prompt: list[int],
    output: RequestOutput,
    logits: list[torch.Tensor],
) -> None:
    model = merged_model(base, ref)
    tokens = _tokens(output)
    assert tokens == hf_greedy(model, prompt, len(tokens))
    want = reference_logits(model, prompt, tokens)
    got = torch.stack(logits)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("name", list(SPECS))
def test_an_adapter_alone_matches_transformers_with_it_merged(
    engines: EngineTracker, base: Path, adapters: dict[str, AdapterRef], name: str
) -> None:
    engine = engines.make(base)
    seen = record_logits(engine)
    prompt = random_prompts(1, 20, 21, seed=3)[0]
    _submit(engine, "one", prompt, adapters[name], NEW_TOKENS)
    output = _drain(engine)["one"]
    _check_against_merged(base, adapters[name], prompt, output, seen["one"])
    # the delta is real: the base model continues the same prompt otherwise
    assert (
        reference_logits(merged_model(base, None), prompt, _tokens(output))
        .sub(torch.stack(seen["one"]))
        .abs()
        .max()
        > 1e-2
    )
    assert engine.stats().loaded_adapters == (name,)


def test_one_batch_mixes_the_base_model_and_three_adapters(
    engines: EngineTracker, base: Path, adapters: dict[str, AdapterRef]
) -> None:
    """Decodes of four models share each step (BGMV) and prompts of different lengths
    prefill together (SGMV); each row is what it is alone, and what transformers says."""
    prompts = random_prompts(4, 9, 40, seed=7)
    refs: list[AdapterRef | None] = [None, *adapters.values()]
    alone: list[tuple[RequestOutput, list[torch.Tensor]]] = []
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        solo = engines.make(base)
        seen = record_logits(solo)
        _submit(solo, f"r{i}", prompt, ref, NEW_TOKENS)
        alone.append((_drain(solo)[f"r{i}"], seen[f"r{i}"]))
    engine = engines.make(base)
    seen = record_logits(engine)
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        _submit(engine, f"r{i}", prompt, ref, NEW_TOKENS)
    batched = _drain(engine)
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        solo_output, solo_logits = alone[i]
        assert _tokens(batched[f"r{i}"]) == _tokens(solo_output)
        for got, want in zip(seen[f"r{i}"], solo_logits, strict=True):
            assert (got - want).abs().max().item() < TOLERANCE
        _check_against_merged(base, ref, prompt, batched[f"r{i}"], seen[f"r{i}"])


def test_base_rows_are_bit_for_bit_those_of_an_engine_without_adapters(
    engines: EngineTracker, base: Path, adapters: dict[str, AdapterRef]
) -> None:
    prompt = random_prompts(1, 30, 31, seed=11)[0]
    fresh = engines.make(base)
    fresh_seen = record_logits(fresh)
    _submit(fresh, "base", prompt, None, NEW_TOKENS)
    _drain(fresh)
    used = engines.make(base)
    _submit(used, "warm", prompt, adapters["qv-r8"], NEW_TOKENS)  # slots now hold an adapter
    _drain(used)
    used_seen = record_logits(used)
    _submit(used, "base", prompt, None, NEW_TOKENS)
    _drain(used)
    assert all(
        torch.equal(a, b) for a, b in zip(fresh_seen["base"], used_seen["base"], strict=True)
    )


def test_the_prefix_cache_is_keyed_by_adapter(
    engines: EngineTracker, base: Path, adapters: dict[str, AdapterRef]
) -> None:
    engine = engines.make(base, block_size=8)
    prompt = random_prompts(1, 40, 41, seed=5)[0]
    first, second = adapters["qv-r8"], adapters["all-r4-rslora"]
    runs = [("a1", first), ("b1", second), ("base", None), ("a2", first)]
    finals: dict[str, RequestOutput] = {}
    for rid, ref in runs:  # one after the other: each may reuse what the earlier cached
        _submit(engine, rid, prompt, ref, NEW_TOKENS)
        finals.update(_drain(engine))
    cached = {rid: finals[rid].metrics.cached_tokens for rid, _ in runs}
    # 40 tokens in 5 blocks; a fully cached prompt recomputes its last block (a token to sample)
    assert cached == {"a1": 0, "b1": 0, "base": 0, "a2": 32}
    assert _tokens(finals["a1"]) == _tokens(finals["a2"])
    assert len({tuple(_tokens(finals[r])) for r in ("a1", "b1", "base")}) == 3


def test_preemption_recomputes_with_the_same_adapter(
    engines: EngineTracker, base: Path, adapters: dict[str, AdapterRef]
) -> None:
    prompts = random_prompts(4, 20, 30, seed=9)
    refs: list[AdapterRef | None] = [*adapters.values(), None]
    want: dict[str, list[int]] = {}
    roomy = engines.make(base)
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        _submit(roomy, f"r{i}", prompt, ref, 24)
    want = {rid: _tokens(out) for rid, out in _drain(roomy).items()}
    tight = engines.make(base, block_size=8, num_gpu_blocks=10, max_model_len=64)
    assert tight.config.enable_prefix_caching  # recompute may reuse its own cached blocks
    seen = record_logits(tight)
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        _submit(tight, f"r{i}", prompt, ref, 24)
    finals = _drain(tight)
    got = {rid: _tokens(out) for rid, out in finals.items()}
    assert tight.scheduler.num_preemptions > 0
    assert got == want
    # and what transformers gives with each adapter merged, logits included
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        _check_against_merged(base, ref, prompt, finals[f"r{i}"], seen[f"r{i}"])


@pytest.mark.skipif(
    not triton_interpreter_enabled(), reason="the Triton kernels on the CPU need TRITON_INTERPRET=1"
)
def test_the_triton_kernels_serve_a_mixed_batch_like_the_cpu_row(
    engines: EngineTracker, base: Path, adapters: dict[str, AdapterRef]
) -> None:
    """What CUDA runs (SGMV/BGMV launchers, interpreted) on the engine's real stacks, rank
    slices and fused-output column views: the same tokens and logits as the CPU row."""
    prompts = random_prompts(4, 9, 30, seed=13)
    refs: list[AdapterRef | None] = [None, *adapters.values()]
    results = []
    for kernels in ("auto", "triton"):
        engine = engines.make(base, kernels=kernels)
        seen = record_logits(engine)
        for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
            _submit(engine, f"r{i}", prompt, ref, 4)
        finals = _drain(engine)
        results.append(({rid: _tokens(out) for rid, out in finals.items()}, seen))
    (cpu_tokens, cpu_logits), (triton_tokens, triton_logits) = results
    assert triton_tokens == cpu_tokens
    for rid, rows in cpu_logits.items():
        torch.testing.assert_close(
            torch.stack(triton_logits[rid]), torch.stack(rows), rtol=0, atol=TOLERANCE
        )
