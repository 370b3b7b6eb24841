"""Weight-only quantization through the whole engine: on load, and from a quantized checkpoint.

int8 per-channel round-to-nearest keeps each weight within half a step of
its row's scale, so greedy decoding on a tiny random Llama must follow the
float engine closely; a checkpoint written by `hydrant models quantize`
must load without running `quantize_model` again and give bit-identical
logits to quantizing the float checkpoint on load (same codes, same ops).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tiny_models import EngineTracker, build_tiny_model, random_prompts, run_to_completion

from hydrant.cli.main import cli
from hydrant.engine import quantized_weights
from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.model_runner import ModelOutput
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.scheduler import SchedulerOutput
from hydrant.engine.sequence import Request
from hydrant.kernels.quantization import QuantizedLinear

NEW_TOKENS = 24
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "llama", seed=3)


def greedy_outputs(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(str(i), prompt, GREEDY))
    finals = run_to_completion(engine)
    return [list(finals[str(i)].outputs[0].token_ids) for i in range(len(prompts))]


def record_logits(engine: LLMEngine) -> list[torch.Tensor]:
    """Wrap the runner so every step's logits are kept, in step order."""
    seen: list[torch.Tensor] = []
    execute = engine.runner.execute

    def recording(out: SchedulerOutput) -> ModelOutput:
        result = execute(out)
        seen.append(result.logits.clone())
        return result

    engine.runner.execute = recording  # type: ignore[method-assign]
    return seen


def quantized_linears(engine: LLMEngine) -> list[QuantizedLinear]:
    return [m for m in engine.runner.model.modules() if isinstance(m, QuantizedLinear)]


def test_int8_engine_follows_the_float_engine(model_dir: Path, engines: EngineTracker) -> None:
    prompts = random_prompts(8, 4, 40, seed=11)
    float_engine = engines.make(model_dir)
    float_logits = record_logits(float_engine)
    reference = greedy_outputs(float_engine, prompts)
    engine = engines.make(model_dir, quantization="int8")
    # every decoder linear (qkv, o, gate_up, down per layer) is int8; the head stays float
    layers = quantized_linears(engine)
    assert len(layers) == 4 * 2 and all(m.mode == "int8" for m in layers)
    assert engine.runner.model.lm_head is not None
    assert not isinstance(engine.runner.model.lm_head, QuantizedLinear)
    int8_logits = record_logits(engine)
    outputs = greedy_outputs(engine, prompts)
    assert all(len(o) == NEW_TOKENS for o in outputs)
    # The first step prefills the same prompts in both engines: its logits must be close
    # (1.4% relative error on this model; 3% leaves room, a broken scale is far above it).
    first, ref_first = int8_logits[0], float_logits[0]
    assert first.shape == ref_first.shape == (len(prompts), first.shape[1])
    relative = (first - ref_first).norm() / ref_first.norm()
    assert 0 < relative < 0.03, relative
    # Greedy errors cascade (one flipped near-tie changes every later input), so count
    # the prefix that agrees with the float engine: most tokens, most prompts entirely.
    prefixes = [
        next((i for i, (a, b) in enumerate(zip(ref, out, strict=True)) if a != b), NEW_TOKENS)
        for ref, out in zip(reference, outputs, strict=True)
    ]
    assert sum(prefixes) >= 0.75 * NEW_TOKENS * len(prompts), prefixes
    assert sum(p == NEW_TOKENS for p in prefixes) >= len(prompts) // 2, prefixes


def test_quantized_checkpoint_loads_without_requantizing(
    model_dir: Path, tmp_path: Path, engines: EngineTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "int8"
    result = CliRunner().invoke(
        cli, ["models", "quantize", str(model_dir), str(dst), "--mode", "int8"]
    )
    assert result.exit_code == 0, result.output
    prompts = random_prompts(4, 4, 30, seed=5)

    on_load = engines.make(model_dir, quantization="int8")
    on_load_logits = record_logits(on_load)
    on_load_tokens = greedy_outputs(on_load, prompts)

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("quantize_model ran on a quantized checkpoint")

    monkeypatch.setattr(quantized_weights, "quantize_model", refuse)
    stored = engines.make(dst, quantization="int8")
    also = engines.make(dst)  # the manifest alone says how to load it
    assert len(quantized_linears(stored)) == len(quantized_linears(on_load)) == 8
    stored_logits = record_logits(stored)
    assert greedy_outputs(stored, prompts) == on_load_tokens
    assert greedy_outputs(also, prompts) == on_load_tokens
    assert len(stored_logits) == len(on_load_logits)
    for ours, theirs in zip(stored_logits, on_load_logits, strict=True):
        assert torch.equal(ours, theirs)


def test_quantized_checkpoint_refuses_another_mode(model_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "int8"
    result = CliRunner().invoke(
        cli, ["models", "quantize", str(model_dir), str(dst), "--mode", "int8"]
    )
    assert result.exit_code == 0, result.output
    config = EngineConfig(quantization="int4", kv_cache_bytes=1 << 22, show_progress=False)
    with pytest.raises(EngineConfigError, match="quantized int8"):
        LLMEngine.from_pretrained(dst, config)


def test_quantization_settings_are_validated() -> None:
    assert EngineConfig(kv_cache_dtype="int8").kv_cache_dtype == "int8"  # issue #5: served
    with pytest.raises(EngineConfigError, match="quantization"):
        EngineConfig(quantization="fp8")  # type: ignore[arg-type]
    with pytest.raises(EngineConfigError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8")  # type: ignore[arg-type]
