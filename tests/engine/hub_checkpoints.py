"""Factories for tiny AWQ / GPTQ checkpoints, written from the formats' published specs.

Each takes a tiny float checkpoint (`tiny_models.build_tiny_model`), draws random
codes, zero points and scales for every decoder projection, packs them with the
exporters' own bit loops (AutoAWQ's `WQLinear_GEMM.from_linear`, AutoGPTQ's
`QuantLinear.pack`, written out here, not Hydrant's helpers), and writes two
directories: the quantized checkpoint with the `quantization_config` those
exporters put in `config.json`, and a dense twin whose projection weights are
what the spec's dequantization gives (`dequantize_*` below, explicit bit
loops again), for transformers to run as the reference.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tiny_models import run_to_completion

from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
# the engine's modules and the checkpoint projections each one fuses, in order
ENGINE_MODULES = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True)
class HubPair:
    """A quantized checkpoint, its dense twin, and each projection's dequantized weight."""

    quantized: Path
    dense: Path
    weights: dict[str, torch.Tensor]  # checkpoint projection name -> float32 [N, K]


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words of 32 bits -> int32, two's complement (the exporters' int32 overflow)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# ---- AWQ (AutoAWQ WQLinear_GEMM) ------------------------------------------------------


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """`[rows, cols]` 4-bit values -> int32 `[rows, cols // 8]`, AutoAWQ's loop."""
    rows, cols = values.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for col in range(cols // 8):
        for i in range(8):
            out[:, col] |= values[:, col * 8 + AWQ_ORDER[i]].to(torch.int64) << (i * 4)
    return _to_int32(out)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """The spec read back: bits `4i ..` of word `c` are column `8c + AWQ_ORDER[i]`."""
    rows, words = packed.shape
    out = torch.zeros(rows, words * 8, dtype=torch.int64)
    wide = packed.to(torch.int64) & 0xFFFFFFFF
    for col in range(words):
        for i in range(8):
            out[:, col * 8 + AWQ_ORDER[i]] = (wide[:, col] >> (4 * i)) & 0xF
    return out


def dequantize_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int
) -> torch.Tensor:
    """`w[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]`, as `[N, K]` float32."""
    codes = unpack_awq(qweight)  # [K, N]
    zeros = unpack_awq(qzeros)  # [K // G, N]
    k = codes.shape[0]
    rows = torch.arange(k) // group
    weight = (codes - zeros[rows]).to(torch.float32) * scales.to(torch.float32)[rows]
    return weight.t().contiguous()


def awq_tensors(
    n: int, k: int, group: int, generator: torch.Generator
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random AWQ GEMM tensors of one `[N, K]` linear and the weight the spec gives."""
    codes = torch.randint(0, 16, (k, n), generator=generator)
    zeros = torch.randint(0, 16, (k // group, n), generator=generator)
    scales = (0.002 + 0.01 * torch.rand(k // group, n, generator=generator)).half()
    tensors = {"qweight": pack_awq(codes), "qzeros": pack_awq(zeros), "scales": scales}
    weight = dequantize_awq(tensors["qweight"], tensors["qzeros"], scales, group)
    rows = torch.arange(k) // group
    direct = ((codes - zeros[rows]).float() * scales.float()[rows]).t()
    assert torch.equal(weight, direct), "the test's AWQ pack and unpack disagree"
    return tensors, weight


def awq_config(group: int, modules_to_not_convert: list[str] | None = None) -> dict[str, Any]:
    """What AutoAWQ writes into config.json."""
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": modules_to_not_convert,
    }


# ---- GPTQ (AutoGPTQ / GPTQModel, checkpoint_format gptq and gptq_v2) ---------------------


def pack_gptq_rows(values: torch.Tensor) -> torch.Tensor:
    """`[K, N]` 4-bit values -> int32 `[K // 8, N]`: AutoGPTQ's qweight loop (along K)."""
    k, n = values.shape
    out = torch.zeros(k // 8, n, dtype=torch.int64)
    for row in range(k // 8):
        for j in range(8):
            out[row] |= values[row * 8 + j].to(torch.int64) << (4 * j)
    return _to_int32(out)


def pack_gptq_columns(values: torch.Tensor) -> torch.Tensor:
    """`[G, N]` 4-bit values -> int32 `[G, N // 8]`: AutoGPTQ's qzeros loop (along N)."""
    return pack_gptq_rows(values.t()).t().contiguous()


def dequantize_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor,
    zero_offset: int,
) -> torch.Tensor:
    """`w[n, k] = (q[k, n] - (stored_z + offset)[g_idx[k], n]) * s[g_idx[k], n]`, `[N, K]`."""
    wide = qweight.to(torch.int64) & 0xFFFFFFFF
    k, n = wide.shape[0] * 8, wide.shape[1]
    codes = torch.zeros(k, n, dtype=torch.int64)
    for row in range(k):
        codes[row] = (wide[row // 8] >> (4 * (row % 8))) & 0xF
    wide_zeros = qzeros.to(torch.int64) & 0xFFFFFFFF
    zeros = torch.zeros(qzeros.shape[0], n, dtype=torch.int64)
    for col in range(n):
        zeros[:, col] = (wide_zeros[:, col // 8] >> (4 * (col % 8))) & 0xF
    zeros = zeros + zero_offset
    groups = g_idx.to(torch.int64)
    weight = (codes - zeros[groups]).to(torch.float32) * scales.to(torch.float32)[groups]
    return weight.t().contiguous()


def gptq_tensors(
    n: int, k: int, group: int, symmetric: bool, v2: bool, generator: torch.Generator
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random GPTQ tensors of one `[N, K]` linear (`group` -1: per channel) and its weight."""
    size = k if group == -1 else group
    codes = torch.randint(0, 16, (k, n), generator=generator)
    if symmetric:
        zeros = torch.full((k // size, n), 8)
    else:
        zeros = torch.randint(1, 16, (k // size, n), generator=generator)
    offset = 0 if v2 else 1
    scales = (0.002 + 0.01 * torch.rand(k // size, n, generator=generator)).half()
    g_idx = (torch.arange(k) // size).to(torch.int32)
    tensors = {
        "qweight": pack_gptq_rows(codes),
        "qzeros": pack_gptq_columns(zeros - offset),
        "scales": scales,
        "g_idx": g_idx,
    }
    weight = dequantize_gptq(tensors["qweight"], tensors["qzeros"], scales, g_idx, offset)
    direct = ((codes - zeros[g_idx.long()]).float() * scales.float()[g_idx.long()]).t()
    assert torch.equal(weight, direct), "the test's GPTQ pack and unpack disagree"
    return tensors, weight


def gptq_config(group: int, symmetric: bool, v2: bool = False) -> dict[str, Any]:
    """What GPTQModel writes into config.json."""
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group,
        "sym": symmetric,
        "desc_act": False,
        "checkpoint_format": "gptq_v2" if v2 else "gptq",
        "damp_percent": 0.01,
        "true_sequential": True,
    }


# ---- writing the pair ----------------------------------------------------------------------


def write_pair(
    float_dir: Path,
    out_dir: Path,
    quantization_config: dict[str, Any],
    make: Any,
    keep_float: tuple[str, ...] = (),
    seed: int = 0,
) -> HubPair:
    """Quantize every projection of `float_dir` (but `keep_float`) with `make(n, k, gen)`.

    Returns the quantized checkpoint, a dense twin holding the dequantized weights
    (the float projections unchanged), and the dequantized weight of each projection.
    """
    state = load_file(str(float_dir / "model.safetensors"))
    config = json.loads((float_dir / "config.json").read_text("utf-8"))
    generator = torch.Generator().manual_seed(seed)
    quantized, dense = dict(state), dict(state)
    weights: dict[str, torch.Tensor] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for projection in PROJECTIONS:
            name = f"model.layers.{layer}.{projection}"
            if name in keep_float:
                weights[name] = state[f"{name}.weight"]
                continue
            n, k = state[f"{name}.weight"].shape
            tensors, weight = make(n, k, generator)
            del quantized[f"{name}.weight"]
            quantized.update({f"{name}.{key}": value for key, value in tensors.items()})
            dense[f"{name}.weight"] = weight
            weights[name] = weight
    quantized_dir, dense_dir = out_dir / "quantized", out_dir / "dense"
    for directory, tensors, extra in (
        (quantized_dir, quantized, {"quantization_config": quantization_config}),
        (dense_dir, dense, {}),
    ):
        directory.mkdir(parents=True)
        for path in float_dir.iterdir():
            if path.name not in ("model.safetensors", "config.json"):
                shutil.copy2(path, directory / path.name)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(directory / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (directory / "config.json").write_text(json.dumps({**config, **extra}, indent=1), "utf-8")
    return HubPair(quantized_dir, dense_dir, weights)


def engine_greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """The engine's greedy continuation of each prompt, all submitted as one batch."""
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(str(i), prompt, GREEDY))
    finals = run_to_completion(engine)
    return [list(finals[str(i)].outputs[0].token_ids) for i in range(len(prompts))]
