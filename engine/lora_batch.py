"""One step's LoRA layout: which adapter slot each row of the batch runs with.

The runner lays a step out decodes first, then prefill chunks. Decode rows are one token
per sequence, each possibly of another adapter: they go to BGMV with a slot per row.
Prefill rows come in chunks of one sequence, so one adapter each: they go to SGMV as
segments. A step in which no sequence has an adapter builds no `LoraBatch` at all, and
the model runs exactly the code it runs without LoRA (bit for bit the same rows).

The stacks are cut to the largest rank in the step (`A[:, :r*P]`, `B[:, :, :r*P]`,
strided views; see lora_slots.py for the layout): a step of rank-8 adapters does rank-8
work even when slots are padded to 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hydrant.engine.lora_slots import FUSED, LoraSlots, Stack
from hydrant.kernels.table import KernelBackend


@dataclass(frozen=True)
class LoraBatch:
    ops: KernelBackend
    stacks: list[dict[str, Stack]]  # per layer, cut to the step's largest rank
    scales: torch.Tensor
    num_decode: int
    token_slots: torch.Tensor  # [num_decode]
    seg_starts: torch.Tensor  # [segments + 1], rows counted from the first prefill row
    seg_slots: torch.Tensor  # [segments]
    max_seg_len: int

    def layer(self, index: int) -> LayerLora:
        return LayerLora(self, self.stacks[index])


@dataclass(frozen=True)
class LayerLora:
    """The step's LoRA for one decoder layer: adds the deltas into a fused projection's output."""

    batch: LoraBatch
    stacks: dict[str, Stack]

    def add(self, y: torch.Tensor, x: torch.Tensor, fused: str) -> None:
        """`y = fused(x)` gets every row's adapter delta (of all the parts it holds)."""
        stack = self.stacks.get(fused)
        if stack is None:  # no resident adapter targets any of its parts
            return
        batch, n_dec = self.batch, self.batch.num_decode
        a, b = stack
        if n_dec > 0:
            batch.ops.lora_bgmv(y[:n_dec], x[:n_dec], a, b, batch.scales, batch.token_slots)
        if n_dec < x.shape[0]:
            batch.ops.lora_sgmv(
                y[n_dec:],
                x[n_dec:],
                a,
                b,
                batch.scales,
                batch.seg_starts,
                batch.seg_slots,
                batch.max_seg_len,
            )


def build_lora_batch(
    ops: KernelBackend,
    slots: LoraSlots,
    row_slots: list[int],
    row_lengths: list[int],
    num_decode: int,
) -> LoraBatch | None:
    """The step's layout from each scheduled chunk's slot and token count, in batch order
    (the first `num_decode` chunks are decodes); None when no chunk has an adapter."""
    used = [s for s in row_slots if s >= 0]
    if not used:
        return None
    rank = max(slots.ranks[s] for s in used)
    stacks = [
        {
            fused: (a[:, : rank * len(FUSED[fused])], b[:, :, : rank * len(FUSED[fused])])
            for fused, (a, b) in layer.items()
        }
        for layer in slots.stacks
    ]
    starts, longest = [0], 0
    for length in row_lengths[num_decode:]:
        starts.append(starts[-1] + length)
        longest = max(longest, length)
    device = slots.device

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return LoraBatch(
        ops=ops,
        stacks=stacks,
        scales=slots.scales,
        num_decode=num_decode,
        token_slots=tensor(row_slots[:num_decode]),
        seg_starts=tensor(starts),
        seg_slots=tensor(row_slots[num_decode:]),
        max_seg_len=longest,
    )
