"""How many sequences a device can really hold: the KV-cache arithmetic, made explicit.

`max_num_seqs` is a logical cap; the physical limit is the number of KV
blocks, which depends on the device memory left after the weights, the KV
bytes per token (layers x KV heads x head dim x dtype, GQA matters 4x), the
block size and how long the sequences get. The field report's pitfall is a
default of 256 trusted on an 80 GB card that can hold far fewer sequences at
long outputs: the engine then queues or preempts instead of running them.
This module computes the limit from first principles, pure Python, so it can
run before a GPU exists.

Memory model (stated so the numbers can be checked by hand):

    budget   = device memory x gpu_memory_utilization
    kv_bytes = budget - weights - reserve - lora   (reserve: CUDA context, activations;
               lora: max_loras adapter slots of max_lora_rank, which the engine keeps free)
    blocks   = floor(kv_bytes / (kv_bytes_per_token x block_size))

A sequence of L tokens holds ceil(L / block_size) blocks (its last block is
partly empty). `safe_max_num_seqs` assumes every sequence reaches the p99
length at once, so no preemption can happen; `expected_concurrency` counts
sequences at their average in-flight size (the prompt plus half the output,
since a running sequence is on average halfway through it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hydrant.engine.capacity_shapes import (
    NAMED_SHAPES,
    CapacityInputError,
    ModelShape,
    resolve_shape,
)

__all__ = [
    "NAMED_SHAPES",
    "CapacityInputError",
    "CapacityPlan",
    "ModelShape",
    "RequestLengths",
    "format_report",
    "kv_bytes_per_token",
    "plan_capacity",
    "resolve_shape",
    "weight_bytes",
]

GIB = 1024**3
FLOAT_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
WEIGHT_DTYPES = (*FLOAT_DTYPE_BYTES, "int8", "int4")
KV_DTYPE_BYTES = {**FLOAT_DTYPE_BYTES, "int8": 1}
# Quantized weights carry float16 scales: one per output row (int8 weights),
# one per group of `int4_group_size` weights (int4).
SCALE_BYTES = 2
# The int8 KV cache carries one float32 scale per token per KV head for each of
# K and V: the kernels' layout (hydrant.kernels.ops.write_kv), which the engine
# allocates, so its block budget and this calculator agree byte for byte.
KV_SCALE_BYTES = 4


@dataclass(frozen=True)
class RequestLengths:
    """Prompt and output lengths of the expected traffic, in tokens."""

    prompt_mean: float
    output_mean: float
    prompt_p99: int
    output_p99: int

    @classmethod
    def fixed(cls, prompt: int, output: int) -> RequestLengths:
        return cls(float(prompt), float(output), prompt, output)

    @classmethod
    def from_samples(cls, samples: Sequence[tuple[int, int]]) -> RequestLengths:
        """From observed (prompt_tokens, output_tokens) pairs; p99 by nearest rank."""
        if not samples:
            raise CapacityInputError("at least one (prompt, output) sample is needed")
        prompts = sorted(p for p, _ in samples)
        outputs = sorted(o for _, o in samples)
        rank = max(math.ceil(0.99 * len(samples)) - 1, 0)
        return cls(
            prompt_mean=sum(prompts) / len(prompts),
            output_mean=sum(outputs) / len(outputs),
            prompt_p99=prompts[rank],
            output_p99=outputs[rank],
        )

    @property
    def p99_tokens(self) -> int:
        return self.prompt_p99 + self.output_p99

    @property
    def mean_in_flight_tokens(self) -> float:
        return self.prompt_mean + self.output_mean / 2


@dataclass(frozen=True)
class CapacityPlan:
    model: str
    param_count: int
    weight_dtype: str
    kv_dtype: str
    block_size: int
    device_bytes: int
    budget_bytes: int
    weight_bytes: int
    reserve_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    p99_tokens: int
    blocks_per_p99_seq: int
    safe_max_num_seqs: int
    mean_blocks_per_seq: int
    fits_at_mean: int
    expected_concurrency: int
    configured_max_num_seqs: int | None
    warnings: list[str] = field(default_factory=list)
    lora_bytes: int = 0


def weight_bytes(shape: ModelShape, dtype: str, int4_group_size: int = 128) -> int:
    """Bytes of the weights; quantized dtypes apply to the decoder projections only."""
    if dtype in FLOAT_DTYPE_BYTES:
        return shape.param_count * FLOAT_DTYPE_BYTES[dtype]
    rest = shape.other_params * SCALE_BYTES
    if dtype == "int8":
        scales = shape.num_layers * shape.linear_rows_per_layer * SCALE_BYTES
        return shape.linear_params + scales + rest
    if dtype == "int4":
        scales = math.ceil(shape.linear_params / int4_group_size) * SCALE_BYTES
        return math.ceil(shape.linear_params / 2) + scales + rest
    raise CapacityInputError(f"weight dtype must be one of {', '.join(WEIGHT_DTYPES)}: {dtype!r}")


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str) -> int:
    """K and V of every layer for one token; int8 adds a scale per token per head."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise CapacityInputError(
            f"KV dtype must be one of {', '.join(KV_DTYPE_BYTES)}: {kv_dtype!r}"
        )
    per_head = shape.head_dim * KV_DTYPE_BYTES[kv_dtype]
    if kv_dtype == "int8":
        per_head += KV_SCALE_BYTES
    return 2 * shape.num_layers * shape.num_kv_heads * per_head


def _check_inputs(
    device_memory_gib: float, block_size: int, utilization: float, reserve_gib: float
) -> None:
    if not device_memory_gib > 0:
        raise CapacityInputError(f"device memory must be > 0 GiB, got {device_memory_gib}")
    if block_size < 1:
        raise CapacityInputError(f"block size must be >= 1, got {block_size}")
    if not 0 < utilization <= 1:
        raise CapacityInputError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    if reserve_gib < 0:
        raise CapacityInputError(f"reserve must be >= 0 GiB, got {reserve_gib}")


def plan_capacity(
    shape: ModelShape,
    *,
    device_memory_gib: float,
    requests: RequestLengths,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    reserve_gib: float = 1.0,
    max_num_seqs: int | None = None,
    int4_group_size: int = 128,
    max_loras: int = 0,
    max_lora_rank: int = 16,
) -> CapacityPlan:
    """Work out the KV capacity of one device for one model and traffic shape.

    `weight_dtype` defaults to the checkpoint's dtype; `kv_dtype` to the
    weight dtype when that is a float type, else float16. `max_loras` LoRA slots of
    `max_lora_rank` take their room first, in the KV dtype's float type (the compute dtype).
    """
    _check_inputs(device_memory_gib, block_size, gpu_memory_utilization, reserve_gib)
    w_dtype = weight_dtype or shape.default_dtype
    k_dtype = kv_dtype or (w_dtype if w_dtype in FLOAT_DTYPE_BYTES else "float16")
    device = int(device_memory_gib * GIB)
    budget = int(device * gpu_memory_utilization)
    weights = weight_bytes(shape, w_dtype, int4_group_size)
    reserve = int(reserve_gib * GIB)
    if max_loras < 0 or max_lora_rank < 1:
        raise CapacityInputError("max_loras must be >= 0 and max_lora_rank >= 1")
    compute = w_dtype if w_dtype in FLOAT_DTYPE_BYTES else "float16"
    lora = max_loras * shape.lora_slot_params(max_lora_rank) * FLOAT_DTYPE_BYTES[compute]
    kv_cache = max(budget - weights - reserve - lora, 0)
    per_token = kv_bytes_per_token(shape, k_dtype)
    block = per_token * block_size
    num_blocks = kv_cache // block
    p99_blocks = max(math.ceil(requests.p99_tokens / block_size), 1)
    safe = num_blocks // p99_blocks
    mean_blocks = max(math.ceil(requests.mean_in_flight_tokens / block_size), 1)
    fits_at_mean = num_blocks // mean_blocks
    expected = fits_at_mean if max_num_seqs is None else min(fits_at_mean, max_num_seqs)

    warnings: list[str] = []
    if weights + reserve > budget:
        warnings.append(
            f"the weights ({weights / GIB:.1f} GiB) and reserve ({reserve_gib:g} GiB) exceed "
            f"the memory budget ({budget / GIB:.1f} GiB): nothing is left for the KV cache"
        )
    elif safe == 0:
        warnings.append(
            f"not even one sequence of the p99 length ({requests.p99_tokens} tokens, "
            f"{p99_blocks} blocks) fits in the {num_blocks} KV blocks"
        )
    if max_num_seqs is not None and max_num_seqs > safe:
        warnings.append(
            f"max_num_seqs={max_num_seqs} cannot all fit: at the p99 length "
            f"({requests.p99_tokens} tokens = {p99_blocks} blocks of {block_size}) the "
            f"{num_blocks} KV blocks hold {safe} sequences; the rest will wait or be "
            f"preempted. Set max_num_seqs <= {safe}, or shorten max_tokens"
        )
    limit = shape.max_position_embeddings
    if limit is not None and requests.p99_tokens > limit:
        warnings.append(
            f"the p99 length ({requests.p99_tokens} tokens) exceeds the model's context "
            f"({limit} tokens)"
        )
    return CapacityPlan(
        model=shape.name,
        param_count=shape.param_count,
        weight_dtype=w_dtype,
        kv_dtype=k_dtype,
        block_size=block_size,
        device_bytes=device,
        budget_bytes=budget,
        weight_bytes=weights,
        reserve_bytes=reserve,
        kv_cache_bytes=kv_cache,
        kv_bytes_per_token=per_token,
        block_bytes=block,
        num_blocks=num_blocks,
        kv_tokens=num_blocks * block_size,
        p99_tokens=requests.p99_tokens,
        blocks_per_p99_seq=p99_blocks,
        safe_max_num_seqs=safe,
        mean_blocks_per_seq=mean_blocks,
        fits_at_mean=fits_at_mean,
        expected_concurrency=expected,
        configured_max_num_seqs=max_num_seqs,
        warnings=warnings,
        lora_bytes=lora,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def format_report(plan: CapacityPlan) -> str:
    """A plain-text table of the plan, warnings last."""
    rows = [
        ("model", f"{plan.model} ({plan.param_count / 1e9:.2f} B parameters)"),
        ("weights", f"{_gib(plan.weight_bytes)} ({plan.weight_dtype})"),
        ("device memory", _gib(plan.device_bytes)),
        ("budget (utilization)", f"{_gib(plan.budget_bytes)}"),
        ("reserve", _gib(plan.reserve_bytes)),
        ("LoRA slots", _gib(plan.lora_bytes)),
        ("KV cache", _gib(plan.kv_cache_bytes)),
        ("KV bytes per token", f"{plan.kv_bytes_per_token:,} ({plan.kv_dtype})"),
        ("block", f"{plan.block_size} tokens = {plan.block_bytes:,} bytes"),
        ("KV blocks", f"{plan.num_blocks:,}"),
        ("KV tokens", f"{plan.kv_tokens:,}"),
        ("p99 sequence", f"{plan.p99_tokens:,} tokens = {plan.blocks_per_p99_seq} blocks"),
        ("safe max_num_seqs", f"{plan.safe_max_num_seqs:,}"),
        ("fit at mean length", f"{plan.fits_at_mean:,} ({plan.mean_blocks_per_seq} blocks each)"),
        ("expected concurrency", f"{plan.expected_concurrency:,}"),
    ]
    if plan.configured_max_num_seqs is not None:
        rows.append(("configured max_num_seqs", f"{plan.configured_max_num_seqs:,}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label.ljust(width)}  {value}" for label, value in rows]
    lines += [f"WARNING: {w}" for w in plan.warnings]
    return "\n".join(lines)
