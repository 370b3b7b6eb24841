"""The quantization accuracy gates: one procedure, asserted by tests and printed by the bench.

Model: a Llama-shaped transformers model (hidden 256, 2 layers, 4 heads over
2 KV heads, head_dim 64, MLP 768, vocab 512) with realistic weight statistics
(`synthetic.apply_realistic_weights`), evaluated in float32 on a fixed set of
prompts (seeded token ids; no real tokenizer is available offline).
Reference: the same model, unquantized, float32. Candidates:

- int8 weights: `quantize_model(model, "int8")`, HF forward;
- int4 weights: `quantize_model(model, "int4", 128)`, plain round-to-nearest;
- int4 weights, calibrated: the same with activation-aware channel scales
  from a separate calibration set of prompts;
- int8 KV: `PagedLlama` (all ops, chunked prefill then decode) with int8
  caches against the same with float32 caches.

Thresholds are set from measured values (seeds 0-2: int8 weights KL 0.005,
top-1 0.95-0.96; int4 RTN KL 0.61-0.70, top-1 0.57-0.59; int4 calibrated KL
0.41-0.43, top-1 0.66-0.68; int8 KV KL 0.0004-0.0005, top-1 0.98-0.99) with
headroom for seed-to-seed spread, not from published numbers for trained 8B
models. They are loose for int4 on purpose and the reason is the model, not
the quantizer: in a random network quantization noise is isotropic and
reaches the logits undiminished, and the 8x outlier channels multiply the
error of the weight columns that read them (without outliers int4 RTN
measures KL 0.11, top-1 0.83). Trained models route logits through a few
high-signal directions and are far more robust. The gates still separate a
working quantizer from a broken one by orders of magnitude (a test swaps the
int4 nibbles and must fail), and calibration must beat RTN by 20% in KL.
Memory ratios are against float16 storage of the same tensors (int8 KV
includes its float32 scales).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from hydrant.kernels.accuracy.metrics import NextTokenMetrics, mean_entropy, next_token_metrics
from hydrant.kernels.accuracy.paged_llama import PagedLlama
from hydrant.kernels.accuracy.synthetic import apply_realistic_weights
from hydrant.kernels.quantization import QuantizationMode, kv_cache_report, quantize_model
from hydrant.kernels.quantization.calibration import calibrate

MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
PROMPTS, PROMPT_LEN, CALIBRATION_PROMPTS = 8, 64, 8


@dataclass(frozen=True)
class Gate:
    name: str
    max_mean_kl: float
    min_top1: float
    max_bytes_ratio: float


GATES = {
    "int8 weights": Gate("int8 weights", max_mean_kl=0.02, min_top1=0.90, max_bytes_ratio=0.55),
    "int4 weights": Gate("int4 weights", max_mean_kl=1.0, min_top1=0.45, max_bytes_ratio=0.30),
    "int4 weights + calibration": Gate(
        "int4 weights + calibration", max_mean_kl=0.6, min_top1=0.55, max_bytes_ratio=0.30
    ),
    "int8 KV": Gate("int8 KV", max_mean_kl=0.005, min_top1=0.95, max_bytes_ratio=0.55),
}
CALIBRATION_MIN_KL_GAIN = 0.2  # calibrated int4 KL <= (1 - this) * RTN int4 KL


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    metrics: NextTokenMetrics
    bytes_ratio: float

    @property
    def passed(self) -> bool:
        return (
            self.metrics.mean_kl <= self.gate.max_mean_kl
            and self.metrics.top1_agreement >= self.gate.min_top1
            and self.bytes_ratio <= self.gate.max_bytes_ratio
        )


def build_model(seed: int = 0) -> Any:
    """The float32 reference model (transformers is a dev dependency, imported here only)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**MODEL_SHAPE)).eval()
    return apply_realistic_weights(model, seed)


def fixed_prompts(seed: int, count: int = PROMPTS, length: int = PROMPT_LEN) -> list[list[int]]:
    gen = torch.Generator().manual_seed(10_000 + seed)
    vocab = int(MODEL_SHAPE["vocab_size"])
    return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(count)]


@torch.no_grad()
def _hf_logits(model: Any, prompts: list[list[int]]) -> torch.Tensor:
    return torch.cat([model(torch.tensor([p])).logits[0] for p in prompts])


def evaluate(seed: int = 0) -> tuple[list[GateResult], float]:
    """Run every gate; returns the results and the reference's mean next-token entropy."""
    model = build_model(seed)
    prompts = fixed_prompts(seed)
    reference = _hf_logits(model, prompts)
    results = []
    calibration = [torch.tensor([p]) for p in fixed_prompts(seed + 1, CALIBRATION_PROMPTS)]
    candidates: tuple[tuple[str, QuantizationMode, bool], ...] = (
        ("int8 weights", "int8", False),
        ("int4 weights", "int4", False),
        ("int4 weights + calibration", "int4", True),
    )
    for name, mode, calibrated in candidates:
        candidate = copy.deepcopy(model)
        scales = calibrate(candidate, calibration, mode) if calibrated else None
        report = quantize_model(candidate, mode, 128, activation_scales=scales)
        metrics = next_token_metrics(reference, _hf_logits(candidate, prompts))
        results.append(GateResult(GATES[name], metrics, report.ratio_vs_float16))
    prefill = [PROMPT_LEN // 2 + 3 * i for i in range(len(prompts))]
    float_kv = PagedLlama(model, block_size=16, kv_cache_dtype=torch.float32).logits(
        prompts, prefill, chunk=24
    )
    int8_kv = PagedLlama(model, block_size=16, kv_cache_dtype="int8").logits(
        prompts, prefill, chunk=24
    )
    config = model.config
    kv = kv_cache_report(
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.hidden_size // config.num_attention_heads,
        4096,
    )
    results.append(
        GateResult(
            GATES["int8 KV"], next_token_metrics(torch.cat(float_kv), torch.cat(int8_kv)), kv.ratio
        )
    )
    return results, mean_entropy(reference)
