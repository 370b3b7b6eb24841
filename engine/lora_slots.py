"""The adapters in device memory: `max_loras` slots of stacked LoRA weights, LRU-evicted.

The SGMV/BGMV kernels take every adapter of a step from one stack per fused projection of
the model (`qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj`), so an adapter is resident
once it is copied into a slot. A fused projection's P parts (q, k, v) share one stack:
`A [slots, R*P, in]` holds rank row r of part p at r*P + p, and `B [slots, out, R*P]`
is block-structured (part p's output columns read only its own rank columns), so one
shrink and one expand serve all three and a step launches 4 LoRA ops per layer, not 7.
Ranks below the maximum, and parts an adapter does not target, are zeros, which add
exactly nothing; with the r-major order, `A[:, :r*P]` is the stack cut to rank r.

A fused projection's stack is allocated when the first adapter that targets one of its
parts arrives: an engine that never serves an adapter holds no LoRA memory, and one whose
adapters touch only attention holds no MLP stacks.

A slot is pinned by every running sequence that uses it; only an unpinned one is evicted,
least recently used first, so a running request's weights never change under it.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.lora_adapter import LoraAdapter, module_shapes

Stack = tuple[torch.Tensor, torch.Tensor]  # A [slots, R * parts, in], B [slots, out, R * parts]
# the model's fused projections and the adapter targets they hold, in output-column order
FUSED: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}


class LoraSlots:
    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.num_layers = config.num_hidden_layers
        self.shapes = module_shapes(config)
        # per layer: fused projection -> its stack (only those some adapter targeted)
        self.stacks: list[dict[str, Stack]] = [{} for _ in range(self.num_layers)]
        self.scales = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.ranks = [0] * num_slots
        self.names: list[str | None] = [None] * num_slots
        self.pins = [0] * num_slots
        # by `LoraAdapter.key` (name and directory), least recently used first
        self._slot_of: OrderedDict[str, int] = OrderedDict()

    def full_bytes(self) -> int:
        """Bytes of every stack once all four fused projections are targeted: what the
        slots can grow to, which the CUDA KV budget leaves free."""
        element = torch.empty((), dtype=self.dtype).element_size()
        per_layer = 0
        for parts in FUSED.values():
            n_in = self.shapes[parts[0]][0]
            n_out = sum(self.shapes[module][1] for module in parts)
            per_layer += self.max_rank * len(parts) * (n_in + n_out)
        return self.num_slots * self.num_layers * per_layer * element

    @property
    def resident(self) -> tuple[str, ...]:
        """The names of the adapters in slots (a name once, though two versions may be
        resident while requests of the older one finish)."""
        names = (self.names[slot] for slot in self._slot_of.values())
        return tuple(dict.fromkeys(name for name in names if name is not None))

    def acquire(self, adapter: LoraAdapter) -> int | None:
        """Pin `adapter`'s slot, copying it in (over the least recently used unpinned slot)
        when it is not resident; None when every slot is pinned by running sequences."""
        slot = self._slot_of.get(adapter.key)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            self._load(slot, adapter)
        self._slot_of.move_to_end(adapter.key)
        self.pins[slot] += 1
        return slot

    def pin(self, slot: int) -> None:
        """One more running sequence on a resident slot (a forked choice)."""
        self.pins[slot] += 1

    def release(self, slot: int) -> None:
        self.pins[slot] -= 1

    def clear(self) -> None:
        """Free every stack (sleep mode); nothing may be pinned."""
        self.stacks = [{} for _ in range(self.num_layers)]
        self._slot_of.clear()
        self.names = [None] * self.num_slots
        self.ranks = [0] * self.num_slots

    def _free_slot(self) -> int | None:
        for slot, name in enumerate(self.names):
            if name is None:
                return slot
        for key, slot in self._slot_of.items():
            if self.pins[slot] == 0:
                del self._slot_of[key]
                return slot
        return None

    def _load(self, slot: int, adapter: LoraAdapter) -> None:
        for fused, parts in FUSED.items():
            if adapter.modules & set(parts):
                for held in self.stacks:
                    if fused not in held:
                        held[fused] = self._new_stack(parts)
        rank = adapter.rank
        for layer, stacks in enumerate(self.stacks):
            for fused, (a_stack, b_stack) in stacks.items():
                parts = FUSED[fused]
                a_view = a_stack[slot].view(self.max_rank, len(parts), -1)  # [R, P, in]
                b_view = b_stack[slot].view(-1, self.max_rank, len(parts))  # [out, R, P]
                a_view.zero_()
                b_view.zero_()
                first = 0
                for index, module in enumerate(parts):
                    width = self.shapes[module][1]
                    weights = adapter.weights.get((layer, module))
                    if weights is not None:
                        a_view[:rank, index].copy_(weights[0])
                        b_view[first : first + width, :rank, index].copy_(weights[1])
                    first += width
        self.scales[slot] = adapter.scaling
        self.ranks[slot] = adapter.rank
        self.names[slot] = adapter.name
        self._slot_of[adapter.key] = slot

    def _new_stack(self, parts: tuple[str, ...]) -> Stack:
        n_in = self.shapes[parts[0]][0]
        n_out = sum(self.shapes[module][1] for module in parts)
        width = self.max_rank * len(parts)
        dtype, device = self.dtype, self.device
        return (
            torch.zeros(self.num_slots, width, n_in, dtype=dtype, device=device),
            torch.zeros(self.num_slots, n_out, width, dtype=dtype, device=device),
        )
