"""A sequence's block table: the block manager's list, with an int32 mirror for each step.

Every step hands the attention kernels a `[rows, blocks]` int32 table of the
decoding sequences' blocks. Built from Python lists, that conversion costs per
block, every step: 32 sequences at 3,000 tokens of context are 6,000 blocks,
about a millisecond of host time a step (measured on this host), paid again
for every token while the GPU or the CPU's forward waits. A table only grows
at its end (a new block every `block_size` tokens), so a NumPy mirror kept in
step with the list converts each block once; a step copies rows of int32.

The block manager keeps using it as the list it was: `BlockTable` is a `list`
whose mutators keep the mirror honest. Appending keeps the synced prefix; any
write inside it (copy-on-write replacing a shared block) or any other change
marks the mirror stale from that point, and `array()` converts again from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt


class BlockTable(list[int]):
    """A list of block ids whose `array()` is an int32 copy, refreshed only where it changed."""

    __slots__ = ("_mirror", "_synced")

    def __init__(self, blocks: Iterable[int] = ()) -> None:
        super().__init__(blocks)
        self._mirror: npt.NDArray[np.int32] = np.empty(max(len(self), 8), dtype=np.int32)
        self._synced = 0  # entries [0, _synced) of the mirror equal the list's

    def array(self) -> npt.NDArray[np.int32]:
        """The blocks as int32 (a view: read it before the table changes again)."""
        n = len(self)
        if n > self._mirror.shape[0]:
            grown = np.empty(max(n, 2 * self._mirror.shape[0]), dtype=np.int32)
            grown[: self._synced] = self._mirror[: self._synced]
            self._mirror = grown
        if self._synced < n:
            self._mirror[self._synced : n] = self[self._synced : n]
            self._synced = n
        return self._mirror[:n]

    def _stale_from(self, index: int) -> None:
        self._synced = min(self._synced, max(index, 0))

    # Writes inside the table: the mirror is stale from the first entry touched.
    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        if isinstance(index, SupportsIndex):
            position = index.__index__()
            self._stale_from(position if position >= 0 else position + len(self))
        else:
            self._stale_from(0)

    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._stale_from(0)

    def insert(self, index: SupportsIndex, value: int) -> None:
        super().insert(index, value)
        self._stale_from(0)

    def pop(self, index: SupportsIndex = -1) -> int:
        value = super().pop(index)
        self._stale_from(0)
        return value

    def remove(self, value: int) -> None:
        super().remove(value)
        self._stale_from(0)

    def clear(self) -> None:
        super().clear()
        self._stale_from(0)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._stale_from(0)

    def reverse(self) -> None:
        super().reverse()
        self._stale_from(0)

    def __imul__(self, count: SupportsIndex) -> BlockTable:
        super().__imul__(count)
        self._stale_from(0)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (BlockTable, (list(self),))


def block_rows(tables: list[list[int]], width: int) -> npt.NDArray[np.int32]:
    """`[len(tables), width]` int32: each table cut to `width` blocks, padded with block 0."""
    out = np.zeros((len(tables), width), dtype=np.int32)
    for row, table in zip(out, tables, strict=True):
        blocks = table.array() if isinstance(table, BlockTable) else np.asarray(table, np.int32)
        take = min(blocks.shape[0], width)
        row[:take] = blocks[:take]
    return out
