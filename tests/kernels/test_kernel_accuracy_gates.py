"""Quantization accuracy gates on a Llama-shaped model, and the ops composed into a forward.

The gates (thresholds, model and why the int4 ones are loose) are defined and
explained in `hydrant.kernels.accuracy.evaluate`; `bench/quant_accuracy.py`
prints the same numbers. Measured on seeds 0-2 of this model, float32 reference:

| candidate            | mean KL   | top-1     | bytes vs fp16 | gate (KL, top-1, bytes) |
|----------------------|-----------|-----------|---------------|-------------------------|
| int8 weights         | 0.005     | 0.95-0.96 | 0.51          | <= 0.02, >= 0.90, <= 0.55 |
| int4 weights (RTN)   | 0.61-0.70 | 0.57-0.59 | 0.28          | <= 1.0,  >= 0.45, <= 0.30 |
| int4 + calibration   | 0.41-0.43 | 0.66-0.68 | 0.29          | <= 0.6,  >= 0.55, <= 0.30 |
| int8 KV cache        | 0.0005    | 0.98-0.99 | 0.53          | <= 0.005, >= 0.95, <= 0.55 |

Random networks pass quantization noise to the logits undiminished and the
synthetic outlier channels amplify it, so the int4 numbers are far worse than
a trained Llama's; the gates are honest about that and still catch a broken
quantizer (the nibble-swap test) by an order of magnitude.
"""

from __future__ import annotations

import copy

import pytest
import torch
from kernel_testing import rel_error
from transformers import LlamaConfig, LlamaForCausalLM

from hydrant.kernels.accuracy import evaluate
from hydrant.kernels.accuracy.metrics import next_token_metrics
from hydrant.kernels.accuracy.paged_llama import PagedLlama
from hydrant.kernels.accuracy.synthetic import apply_realistic_weights
from hydrant.kernels.quantization import QuantizedLinear, quantize_model
from hydrant.kernels.triton_backend import TRITON

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 500000.0,
}


@pytest.fixture(scope="module")
def gate_results() -> dict[str, evaluate.GateResult]:
    results, entropy = evaluate.evaluate(seed=0)
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


def test_a_broken_int4_layout_fails_the_gate_by_far() -> None:
    """Swapping the nibbles (even/odd columns) must be caught: the gate discriminates."""
    model = evaluate.build_model(0)
    prompts = evaluate.fixed_prompts(0, count=2)
    with torch.no_grad():
        reference = torch.cat([model(torch.tensor([p])).logits[0] for p in prompts])
        quantize_model(model, "int4", 128)
        for module in model.modules():
            if isinstance(module, QuantizedLinear):
                module.qweight = (module.qweight >> 4) | (module.qweight << 4)
        broken = torch.cat([model(torch.tensor([p])).logits[0] for p in prompts])
    kl = next_token_metrics(reference, broken).mean_kl
    assert kl > 3 * evaluate.GATES["int4 weights"].max_mean_kl


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
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
    return apply_realistic_weights(LlamaForCausalLM(config).eval(), seed)


def test_paged_forward_reproduces_transformers_logits() -> None:
    """Chunked prefill + decode through every reference op equals HF's forward (llama3 rope)."""
    model = tiny_model()
    gen = torch.Generator().manual_seed(5)
    sequences = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (23, 9, 40)]
    outputs = PagedLlama(model, block_size=8, backend="reference").logits(
        sequences, [17, 1, 20], chunk=6
    )
    for seq, out in zip(sequences, outputs, strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([seq])).logits[0]
        assert rel_error(out, expected) < 1e-5


def test_triton_ops_compose_into_the_same_forward() -> None:
    """The whole forward on Triton kernels (int4 weights, int8 KV) equals the reference path."""
    pytest.importorskip("triton")
    model = tiny_model(1)
    quantize_model(model, "int4", 64)
    gen = torch.Generator().manual_seed(6)
    sequences = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (14, 6)]
    prefill = [9, 3]
    results = {}
    for backend in ("reference", "triton"):
        runner = PagedLlama(
            copy.deepcopy(model), block_size=8, kv_cache_dtype="int8", backend=backend
        )
        if backend == "triton":
            runner.model.apply(_pin_triton)
        results[backend] = torch.cat(runner.logits(sequences, prefill, chunk=5))
    assert not results["triton"].isnan().any()
    assert rel_error(results["triton"], results["reference"]) < 1e-3


def _pin_triton(module: torch.nn.Module) -> None:
    """QuantizedLinear runs the row it is bound to (by default its device's): pin Triton."""
    if isinstance(module, QuantizedLinear):
        module.backend = TRITON
