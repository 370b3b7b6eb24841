"""Teacher-forced logits at every position, from the engine's own model runner and KV cache.

The quantization gates compare next-token distributions position by position,
which serving never computes (it keeps the last position of each sequence).
This builds a `ModelRunner` exactly as the engine does (`from_pretrained`:
the loader, quantization on load or a quantized checkpoint, the kernel
backend of `EngineConfig.kernels`, the float or int8 paged KV cache) and
feeds it fixed sequences with the engine's step layout (`build_metadata`, the
runner's decode planner): each sequence's first tokens are prefilled in
chunks, batched with the others still prefilling, later chunks reading the
earlier ones from the cache; its remaining tokens are then decoded one per
step, batched with every sequence still going, so decode batches mix context
lengths. Blocks are dealt out shuffled, so block tables are not contiguous.
There is no scheduler and no sampling: the next token is always the given one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from hydrant.engine.attention import build_metadata
from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.model_runner import ModelRunner


def build_runner(model_dir: Path, config: EngineConfig) -> ModelRunner:
    """The runner `LLMEngine.from_pretrained` would build for this checkpoint and config."""
    model_config = ModelConfig.from_pretrained(model_dir)
    max_model_len = config.max_model_len or model_config.max_model_len
    return ModelRunner.from_pretrained(model_dir, model_config, config, max_model_len)


def blocks_needed(sequences: Sequence[Sequence[int]], block_size: int) -> int:
    """KV blocks `teacher_forced_logits` deals out for these sequences."""
    return len(sequences) * -(-max(len(s) for s in sequences) // block_size)


@torch.inference_mode()
def teacher_forced_logits(
    runner: ModelRunner,
    sequences: Sequence[Sequence[int]],
    prefill_lengths: Sequence[int],
    chunk: int,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Float32 logits `[len, V]` at every position of every sequence.

    Sequence b's first `prefill_lengths[b]` tokens are prefilled in chunks of
    `chunk`; its remaining tokens are decoded one per step. Each call deals
    the cache's blocks afresh, overwriting what an earlier call left there.
    """
    lengths = [len(s) for s in sequences]
    if (
        len(prefill_lengths) != len(sequences)
        or chunk <= 0
        or not sequences
        or any(not 0 < p <= n for p, n in zip(prefill_lengths, lengths, strict=True))
    ):
        raise EngineConfigError("need 0 < prefill_lengths[b] <= len(sequences[b]), chunk > 0")
    bs = runner.block_size
    per_seq = -(-max(lengths) // bs)
    if blocks_needed(sequences, bs) > runner.num_blocks:
        raise EngineConfigError(f"the KV cache has {runner.num_blocks} blocks; these need more")
    order = torch.randperm(runner.num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = [order[b * per_seq : (b + 1) * per_seq].tolist() for b in range(len(sequences))]
    outputs: list[list[torch.Tensor]] = [[] for _ in sequences]
    cursor = [0] * len(sequences)
    while any(c < n for c, n in zip(cursor, lengths, strict=True)):
        prefilling = [b for b, c in enumerate(cursor) if c < prefill_lengths[b]]
        active = prefilling or [b for b, c in enumerate(cursor) if c < lengths[b]]
        ends = [
            min(cursor[b] + chunk, prefill_lengths[b]) if prefilling else cursor[b] + 1
            for b in active
        ]
        logits = _step(runner, sequences, tables, active, cursor, ends, decode=not prefilling)
        sizes = [end - cursor[b] for b, end in zip(active, ends, strict=True)]
        for b, end, piece in zip(active, ends, logits.split(sizes), strict=True):
            outputs[b].append(piece)
            cursor[b] = end
    return [torch.cat(parts) for parts in outputs]


def _step(
    runner: ModelRunner,
    sequences: Sequence[Sequence[int]],
    tables: list[list[int]],
    active: list[int],
    starts: list[int],
    ends: list[int],
    decode: bool,
) -> torch.Tensor:
    """One forward of the active sequences' tokens `[starts[b], end)`; logits of every row."""
    bs = runner.block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for b, end in zip(active, ends, strict=True):
        for pos in range(starts[b], end):
            ids.append(int(sequences[b][pos]))
            positions.append(pos)
            slots.append(tables[b][pos // bs] * bs + pos % bs)
    step_tables = [tables[b] for b in active]
    cu = [0]
    for b, end in zip(active, ends, strict=True):
        cu.append(cu[-1] + end - starts[b])
    meta = build_metadata(
        slots,
        step_tables if decode else [],
        ends if decode else [],
        [] if decode else step_tables,
        [] if decode else ends,
        [0] if decode else cu,
        bs,
        runner.device,
        runner.decode_planner,
    )
    device = runner.device
    hidden = runner.model(
        torch.tensor(ids, dtype=torch.long, device=device),
        torch.tensor(positions, dtype=torch.long, device=device),
        runner.kv_caches,
        meta,
    )
    return runner.model.compute_logits(hidden).cpu()
