"""Quantization accuracy gates on the engine's own model, and that model's forward per backend.

The gates (thresholds, model and why the int4 ones are loose) are defined and
explained in `hydrant.engine.accuracy.evaluate`; `bench/quant_accuracy.py`
prints the same numbers. Each gate runs the engine's model, loaded by the
engine's loader, on the `cpu` and `reference` kernel backends. Measured on
seeds 0-2 of this model, float32 reference (both backends agree to 1e-5):

| candidate            | mean KL   | top-1     | bytes vs fp16 | gate (KL, top-1, bytes) |
|----------------------|-----------|-----------|---------------|-------------------------|
| int8 weights         | 0.005     | 0.95-0.96 | 0.51          | <= 0.02, >= 0.90, <= 0.55 |
| int4 weights (RTN)   | 0.61-0.70 | 0.57-0.59 | 0.28          | <= 1.0,  >= 0.45, <= 0.30 |
| int4 + calibration   | 0.42-0.43 | 0.65-0.66 | 0.285         | <= 0.6,  >= 0.55, <= 0.30 |
| int8 KV cache        | 0.0005    | 0.98-0.99 | 0.53          | <= 0.005, >= 0.95, <= 0.55 |

Random networks pass quantization noise to the logits undiminished and the
synthetic outlier channels amplify it, so the int4 numbers are far worse than
a trained Llama's; the gates are honest about that and still catch a broken
quantizer (the nibble-swap test) by an order of magnitude.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hydrant.engine.accuracy import evaluate
from hydrant.engine.accuracy.scoring import blocks_needed, build_runner, teacher_forced_logits
from hydrant.engine.engine_config import EngineConfig
from hydrant.kernels.accuracy.metrics import next_token_metrics
from hydrant.kernels.accuracy.synthetic import apply_realistic_weights
from hydrant.kernels.quantization import QuantizedLinear
from hydrant.kernels.triton_backend import triton_interpreter_enabled

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 500000.0,
}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    return float((out64 - ref64).norm() / ref64.norm().clamp(min=1e-30))


@pytest.fixture(scope="module", params=["cpu", "reference"])
def gate_results(request: pytest.FixtureRequest) -> dict[str, evaluate.GateResult]:
    results, entropy = evaluate.evaluate(seed=0, backend=request.param)
    assert 0.5 < entropy < 3.0, "the reference must be confident, not near-uniform"
    return {r.gate.name: r for r in results}


@pytest.mark.parametrize("name", list(evaluate.GATES))
def test_accuracy_gate(gate_results: dict[str, evaluate.GateResult], name: str) -> None:
    result = gate_results[name]
    gate = result.gate
    assert result.metrics.mean_kl <= gate.max_mean_kl, result
    assert result.metrics.top1_agreement >= gate.min_top1, result
    assert result.bytes_ratio <= gate.max_bytes_ratio, result


def test_calibration_beats_round_to_nearest(gate_results: dict[str, evaluate.GateResult]) -> None:
    rtn = gate_results["int4 weights"].metrics.mean_kl
    calibrated = gate_results["int4 weights + calibration"].metrics.mean_kl
    assert calibrated <= (1 - evaluate.CALIBRATION_MIN_KL_GAIN) * rtn


def test_a_broken_int4_layout_fails_the_gate_by_far(tmp_path: Path) -> None:
    """Swapping the nibbles (even/odd columns) must be caught: the gate discriminates."""
    model_dir = evaluate.write_checkpoint(tmp_path / "model", 0)
    prompts = evaluate.fixed_prompts(0, count=2)
    reference = evaluate.score(build_runner(model_dir, evaluate.engine_config("cpu")), prompts)
    runner = build_runner(model_dir, evaluate.engine_config("cpu", quantization="int4"))
    for module in runner.model.modules():
        if isinstance(module, QuantizedLinear):
            module.qweight = (module.qweight >> 4) | (module.qweight << 4)
    broken = evaluate.score(runner, prompts)
    kl = next_token_metrics(reference, broken).mean_kl
    assert kl > 3 * evaluate.GATES["int4 weights"].max_mean_kl


def tiny_checkpoint(directory: Path, seed: int = 0) -> tuple[Path, LlamaForCausalLM]:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=200,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rope_parameters=LLAMA3,
    )
    model = apply_realistic_weights(LlamaForCausalLM(config).eval(), seed)
    model.save_pretrained(directory)
    return directory, model


def _config(sequences: list[list[int]], **options: Any) -> EngineConfig:
    blocks = max(blocks_needed(sequences, 8), 64 // 8)  # a max_model_len sequence must fit
    return EngineConfig(block_size=8, num_gpu_blocks=blocks, show_progress=False, **options)


def test_paged_forward_reproduces_transformers_logits(tmp_path: Path) -> None:
    """Chunked prefill + decode through the engine's model on the reference ops equals HF's
    forward (llama3 rope)."""
    model_dir, model = tiny_checkpoint(tmp_path / "model")
    gen = torch.Generator().manual_seed(5)
    sequences = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (23, 9, 40)]
    runner = build_runner(model_dir, _config(sequences, kernels="reference"))
    outputs = teacher_forced_logits(runner, sequences, [17, 1, 20], chunk=6)
    for seq, out in zip(sequences, outputs, strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([seq])).logits[0]
        assert rel_error(out, expected) < 1e-5


def test_triton_ops_compose_into_the_same_forward(tmp_path: Path) -> None:
    """The engine's whole forward on Triton kernels (int4 weights, int8 KV) equals the
    reference backend's."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not triton_interpreter_enabled():
        pytest.skip("the Triton kernels on the CPU need TRITON_INTERPRET=1")
    model_dir, _ = tiny_checkpoint(tmp_path / "model", 1)
    gen = torch.Generator().manual_seed(6)
    sequences = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (14, 6)]
    prefill = [9, 3]
    results = {}
    for backend in ("reference", "triton"):
        config = _config(
            sequences, kernels=backend, device=device, quantization="int4", kv_cache_dtype="int8"
        )
        runner = build_runner(model_dir, config)
        assert any(isinstance(m, QuantizedLinear) for m in runner.model.modules())
        results[backend] = torch.cat(teacher_forced_logits(runner, sequences, prefill, chunk=5))
    assert not results["triton"].isnan().any()
    assert rel_error(results["triton"], results["reference"]) < 1e-3
