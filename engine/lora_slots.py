"""The adapters in device memory: `max_loras` slots of stacked LoRA weights, LRU-evicted.

The SGMV/BGMV kernels take every adapter of a step from one stack per targeted projection
(`A [slots, max_lora_rank, in]`, `B [slots, out, max_lora_rank]`), so an adapter is
resident once it is copied into a slot; ranks below the maximum are zero-padded, which
adds exactly nothing. A projection's stack is allocated when the first adapter that
targets it arrives: an engine that never serves an adapter holds no LoRA memory, and one
whose adapters touch only q/v holds no MLP stacks.

A slot is pinned by every running sequence that uses it; only an unpinned one is evicted,
least recently used first, so a running request's weights never change under it.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.lora_adapter import LoraAdapter, module_shapes

Stack = tuple[torch.Tensor, torch.Tensor]  # A [slots, R, in], B [slots, out, R]


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
        # per layer: projection -> its stack (only projections some adapter targeted)
        self.stacks: list[dict[str, Stack]] = [{} for _ in range(self.num_layers)]
        self.scales = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.ranks = [0] * num_slots
        self.names: list[str | None] = [None] * num_slots
        self.pins = [0] * num_slots
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # least recently used first

    @property
    def resident(self) -> tuple[str, ...]:
        return tuple(self._slot_of)

    def acquire(self, adapter: LoraAdapter) -> int | None:
        """Pin `adapter`'s slot, copying it in (over the least recently used unpinned slot)
        when it is not resident; None when every slot is pinned by running sequences."""
        slot = self._slot_of.get(adapter.name)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            self._load(slot, adapter)
        self._slot_of.move_to_end(adapter.name)
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
        for name, slot in self._slot_of.items():
            if self.pins[slot] == 0:
                del self._slot_of[name]
                return slot
        return None

    def _load(self, slot: int, adapter: LoraAdapter) -> None:
        for module in adapter.modules:
            for held in self.stacks:
                if module not in held:
                    held[module] = self._new_stack(module)
        for layer, stacks in enumerate(self.stacks):
            for module, (a_stack, b_stack) in stacks.items():
                a_stack[slot].zero_()
                b_stack[slot].zero_()
                weights = adapter.weights.get((layer, module))
                if weights is not None:
                    a, b = weights
                    a_stack[slot, : adapter.rank].copy_(a)
                    b_stack[slot, :, : adapter.rank].copy_(b)
        self.scales[slot] = adapter.scaling
        self.ranks[slot] = adapter.rank
        self.names[slot] = adapter.name
        self._slot_of[adapter.name] = slot

    def _new_stack(self, module: str) -> Stack:
        n_in, n_out = self.shapes[module]
        dtype, device = self.dtype, self.device
        return (
            torch.zeros(self.num_slots, self.max_rank, n_in, dtype=dtype, device=device),
            torch.zeros(self.num_slots, n_out, self.max_rank, dtype=dtype, device=device),
        )
