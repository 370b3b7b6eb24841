"""The engine with an int8 KV cache (issue #5): it serves, agrees with the float cache, and
holds about half the bytes of float16 per block.

The float-KV engine is the reference (it is token-identical to transformers, see
test_engine_greedy.py). Quantizing K/V to int8 per token per head perturbs each
element by at most amax/254, which moves logits slightly; on these tiny random
models the next-token distribution is nearly flat (entropy ~7.5 nats against
log(2048) = 7.6), so a near-tie can flip a greedy token and the continuations
then differ. What we hold the int8 cache to, measured on the families below
(16 prompts of 1-149 tokens, 32 greedy tokens, chunked prefill mixed with decodes):

    family   identical continuations   teacher-forced top-1   prefill KL mean / max
    llama    13/16                     0.994                  1.3e-6 / 2.7e-6
    gqa      12/16                     0.991                  5.6e-6 / 8.8e-6
    qwen2    16/16                     1.000                  4.8e-7 / 1.1e-6

The bounds are an order of magnitude above that, and far below what a wrong
cache gives: the KL between two *different* prompts' next-token distributions
is 0.05-0.3 on the same models, so a scale read from the wrong slot or a missed
write cannot stay under 1e-4.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_models import (
    EngineTracker,
    Family,
    assert_no_kv_leak,
    build_tiny_model,
    random_prompts,
    record_block_copies,
    run_to_completion,
)

from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.kv_cache import allocate_kv_caches, bytes_per_block, copy_blocks
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.model_runner import ModelOutput, ModelRunner
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.scheduler import SchedulerOutput
from hydrant.engine.sequence import Request
from hydrant.kernels.quantization import kv_cache_bytes
from hydrant.kernels.triton_backend import triton_interpreter_enabled

NEW_TOKENS = 32
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
FAMILIES: tuple[Family, ...] = ("llama", "gqa", "qwen2")  # MHA; GQA 4:1; biases + tied head
# chunked prefill (32-token chunks for long prompts) mixed with decodes in one step
CHUNKED = {"max_num_batched_tokens": 96, "short_lane_tokens": 96, "long_lane_tokens": 32}

MIN_IDENTICAL = 11 / 16  # continuations identical over all NEW_TOKENS tokens
MIN_TOP1 = 0.97  # argmax agreement at every position where both have the same context
MAX_KL_MEAN = 5e-5
MAX_KL = 1e-4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[Family, Path]:
    root = tmp_path_factory.mktemp("kv_int8")
    return {family: build_tiny_model(root / family, family, seed=7) for family in FAMILIES}


def _runner(engine: LLMEngine) -> ModelRunner:
    assert isinstance(engine.runner, ModelRunner)
    return engine.runner


def _generate(
    engine: LLMEngine, prompts: list[list[int]], tag: str = "r", max_tokens: int = NEW_TOKENS
) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Greedy continuations, and the logits row the sampler got at each step, per request."""
    runner = _runner(engine)
    execute = runner.execute
    rows: dict[str, list[torch.Tensor]] = {}

    def recording(out: SchedulerOutput) -> ModelOutput:
        result = execute(out)
        for logits, seq in zip(result.logits, result.sample_seqs, strict=True):
            rows.setdefault(seq.request.request_id, []).append(logits.clone())
        return result

    runner.execute = recording
    try:
        for i, prompt in enumerate(prompts):
            engine.add_request(Request(f"{tag}{i}", prompt, replace(GREEDY, max_tokens=max_tokens)))
        finals = run_to_completion(engine)
    finally:
        del runner.execute
    tokens = [list(finals[f"{tag}{i}"].outputs[0].token_ids) for i in range(len(prompts))]
    return tokens, [rows[f"{tag}{i}"] for i in range(len(prompts))]


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    p = torch.log_softmax(p_logits.double(), dim=-1)
    q = torch.log_softmax(q_logits.double(), dim=-1)
    return float((p.exp() * (p - q)).sum())


# ---- settings ------------------------------------------------------------------------------


def test_int8_is_accepted_and_other_kv_dtypes_are_refused() -> None:
    assert EngineConfig(kv_cache_dtype="int8").kv_cache_dtype == "int8"
    assert EngineConfig().kv_cache_dtype == "auto"
    for bad in ("fp8", "float16", "INT8", ""):
        with pytest.raises(EngineConfigError, match="kv_cache_dtype"):
            EngineConfig(kv_cache_dtype=bad)


def test_the_setting_reaches_the_engine_from_the_environment() -> None:
    from hydrant.errors import ConfigurationError
    from hydrant.settings import load_settings

    assert load_settings({"HYDRANT_KV_CACHE_DTYPE": "int8"}).kv_cache_dtype == "int8"
    assert load_settings({}).kv_cache_dtype == "auto"
    with pytest.raises(ConfigurationError, match="HYDRANT_KV_CACHE_DTYPE"):
        load_settings({"HYDRANT_KV_CACHE_DTYPE": "fp8"})


async def test_a_worker_builds_its_engine_with_the_int8_cache(
    model_dirs: dict[Family, Path],
) -> None:
    from hydrant.engine.worker.runtime import WorkerOptions, WorkerRuntime

    path = str(model_dirs["llama"])
    options = WorkerOptions(
        model="tiny", path=path, secret="s", kv_cache_bytes=1 << 22, kv_cache_dtype="int8"
    )
    runtime = WorkerRuntime(options)
    await runtime.load()
    try:
        assert runtime.engine is not None and runtime.state == "ready"
        runner = _runner(runtime.engine.engine)
        assert runner.kv_int8 and len(runner.kv_caches[0]) == 4
    finally:
        await runtime.unload()


# ---- bytes ---------------------------------------------------------------------------------

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
}


def test_an_int8_block_is_half_of_float16_plus_the_scales() -> None:
    config = ModelConfig.from_dict(LLAMA3_8B)
    int8 = bytes_per_block(config, 16, torch.int8)
    # 2 (K, V) x 32 layers x 8 KV heads x 16 tokens x (128 codes + a 4-byte float32 scale)
    assert int8 == 2 * 32 * 8 * 16 * (128 + 4)
    # the kernels' own footprint arithmetic agrees
    assert int8 == kv_cache_bytes(32, 8, 128, 16, "int8")
    assert int8 / bytes_per_block(config, 16, torch.float16) == pytest.approx(132 / 256)
    assert int8 / bytes_per_block(config, 16, torch.float32) == pytest.approx(132 / 512)


def test_the_same_budget_holds_more_int8_blocks_and_the_bytes_are_what_is_allocated(
    model_dirs: dict[Family, Path], engines: EngineTracker, caplog: pytest.LogCaptureFixture
) -> None:
    budget = 1 << 22
    caplog.set_level(logging.INFO, logger="hydrant.engine.model_runner")
    float_kv = _runner(engines.make(model_dirs["gqa"], kv_cache_bytes=budget))
    int8_kv = _runner(engines.make(model_dirs["gqa"], kv_cache_bytes=budget, kv_cache_dtype="int8"))
    config = int8_kv.model_config  # 2 layers, 2 KV heads, head_dim 16
    per_block = 2 * 2 * 2 * 16 * (16 + 4)
    assert bytes_per_block(config, 16, torch.int8) == per_block
    assert int8_kv.num_blocks == budget // per_block
    assert int8_kv.kv_cache_bytes == int8_kv.num_blocks * per_block <= budget
    assert float_kv.kv_cache_bytes == float_kv.num_blocks * 2 * 2 * 2 * 16 * 16 * 4 <= budget
    # float32 stores 64 bytes per head, int8 16 + 4: 3.2x the blocks
    assert int8_kv.num_blocks / float_kv.num_blocks == pytest.approx(64 / 20, rel=0.01)
    for k, v, k_scale, v_scale in int8_kv.kv_caches:
        assert k.dtype == v.dtype == torch.int8
        assert k.shape == (int8_kv.num_blocks, 16, 2, 16)
        assert k_scale.dtype == v_scale.dtype == torch.float32
        assert k_scale.shape == v_scale.shape == k.shape[:3]
    report = [r.getMessage() for r in caplog.records if "KV cache:" in r.getMessage()]
    assert f"{int8_kv.kv_cache_bytes} bytes" in report[-1]
    assert "int8 + float32 scales" in report[-1]
    assert f"({int8_kv.num_blocks * 2 * 2 * 2 * 16 * 16 * 4} in float32)" in report[-1]


# ---- accuracy ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_kv_agrees_with_the_float_kv_engine(
    family: Family, model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    prompts = random_prompts(16, 1, 150, seed=11)
    float_tokens, float_rows = _generate(engines.make(model_dirs[family], **CHUNKED), prompts)
    int8_engine = engines.make(model_dirs[family], kv_cache_dtype="int8", **CHUNKED)
    int8_tokens, int8_rows = _generate(int8_engine, prompts)

    identical = sum(a == b for a, b in zip(float_tokens, int8_tokens, strict=True))
    assert identical / len(prompts) >= MIN_IDENTICAL, (identical, float_tokens, int8_tokens)

    prefill_kl = [_kl(f[0], q[0]) for f, q in zip(float_rows, int8_rows, strict=True)]
    assert sum(prefill_kl) / len(prefill_kl) <= MAX_KL_MEAN, prefill_kl
    assert max(prefill_kl) <= MAX_KL, prefill_kl

    # teacher-forced: up to and including the first step where the tokens differ, both
    # engines had the same context, so their distributions are comparable position by position
    agree, total, kls = 0, 0, []
    for f_tok, q_tok, f_rows, q_rows in zip(
        float_tokens, int8_tokens, float_rows, int8_rows, strict=True
    ):
        same_context = next(
            (j for j, (a, b) in enumerate(zip(f_tok, q_tok, strict=True)) if a != b), None
        )
        last = NEW_TOKENS - 1 if same_context is None else same_context
        for j in range(last + 1):
            agree += int(f_rows[j].argmax() == q_rows[j].argmax())
            total += 1
            kls.append(_kl(f_rows[j], q_rows[j]))
    assert agree / total >= MIN_TOP1, (agree, total)
    assert max(kls) <= MAX_KL
    assert int8_engine.scheduler.num_preemptions == 0


@pytest.mark.skipif(
    not triton_interpreter_enabled(), reason="the Triton kernels on the CPU need TRITON_INTERPRET=1"
)
def test_the_triton_kernels_serve_the_int8_cache_like_the_references(
    model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    """What CUDA runs (the Triton write/decode/prefill launchers, interpreted here) on the
    engine's real cache tensors and views: the launchers' stride and layout checks pass and
    the logits equal the references'."""
    prompts = random_prompts(3, 1, 40, seed=11)
    small = {"max_num_batched_tokens": 32, "short_lane_tokens": 32, "long_lane_tokens": 16}
    params = {"kv_cache_dtype": "int8", **small}
    reference_tokens, reference_rows = _generate(
        engines.make(model_dirs["gqa"], **params), prompts, max_tokens=6
    )
    triton_tokens, triton_rows = _generate(
        engines.make(model_dirs["gqa"], kernels="triton", **params), prompts, max_tokens=6
    )
    assert triton_tokens == reference_tokens
    for ours, theirs in zip(triton_rows, reference_rows, strict=True):
        torch.testing.assert_close(torch.stack(ours), torch.stack(theirs), rtol=0, atol=1e-4)


# ---- caching, preemption, copy-on-write, sleep ---------------------------------------------


def test_prefix_cache_hits_and_preemption_do_not_change_int8_results(
    model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    model_dir = model_dirs["gqa"]
    prefix = random_prompts(1, 70, 71, seed=12)[0]
    shared = [prefix + tail for tail in random_prompts(6, 1, 30, seed=13)]
    prompts = random_prompts(12, 1, 150, seed=14)
    alone = engines.make(model_dir, kv_cache_dtype="int8", enable_prefix_caching=False)
    expected_shared = [_generate(alone, [p], tag=f"s{i}-")[0][0] for i, p in enumerate(shared)]
    expected = _generate(alone, prompts)[0]

    cached = engines.make(model_dir, kv_cache_dtype="int8")
    assert _generate(cached, shared[:1], tag="first")[0] == expected_shared[:1]
    for i, prompt in enumerate(shared[1:]):
        cached.add_request(Request(f"s{i}", prompt, GREEDY))
    finals = run_to_completion(cached)
    assert [finals[f"s{i}"].outputs[0].token_ids for i in range(5)] == expected_shared[1:]
    assert all(finals[f"s{i}"].metrics.cached_tokens >= 64 for i in range(5))

    for caching in (True, False):
        small = engines.make(
            model_dir, kv_cache_dtype="int8", num_gpu_blocks=24, enable_prefix_caching=caching
        )
        assert _generate(small, prompts)[0] == expected
        assert small.scheduler.num_preemptions > 0
        assert_no_kv_leak(small)


def test_copy_on_write_copies_the_scales(
    model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    config = ModelConfig.from_pretrained(model_dirs["gqa"])
    caches = allocate_kv_caches(config, 6, 4, torch.int8, "cpu")
    for layer in caches:
        for tensor in layer:
            tensor[1] = torch.arange(tensor[1].numel()).view(tensor[1].shape).to(tensor.dtype) + 1
    copy_blocks(caches, [(1, 4)])
    for layer in caches:
        assert len(layer) == 4
        for tensor in layer:
            assert torch.equal(tensor[4], tensor[1]) and tensor[4].any()
            assert not tensor[3].any()

    # through the engine: n=3 greedy choices share the prompt's partial block, then diverge
    engine = engines.make(model_dirs["gqa"], kv_cache_dtype="int8")
    prompt = random_prompts(1, 37, 38, seed=5)[0]
    single = _generate(engine, [prompt])[0][0]
    copies = record_block_copies(engine)
    engine.add_request(Request("n3", prompt, SamplingParams(n=3, max_tokens=16, temperature=0.0)))
    out = run_to_completion(engine)["n3"]
    assert sum(copies) == 2  # 37 tokens: the shared partial block is copied for two of the three
    assert all(list(c.token_ids) == single[:16] for c in out.outputs)


def test_sleep_and_wake_keep_the_int8_layout(
    model_dirs: dict[Family, Path], engines: EngineTracker
) -> None:
    engine = engines.make(model_dirs["llama"], kv_cache_dtype="int8")
    runner = _runner(engine)
    prompts = random_prompts(3, 5, 40, seed=3)
    before = _generate(engine, prompts, "a")[0]
    kv_bytes = runner.kv_cache_bytes
    engine.sleep()
    assert runner.kv_caches == [] and runner.kv_cache_bytes == 0
    engine.wake()
    assert runner.kv_cache_bytes == kv_bytes > 0
    assert all(len(layer) == 4 and not any(t.any() for t in layer) for layer in runner.kv_caches)
    assert _generate(engine, prompts, "b")[0] == before
