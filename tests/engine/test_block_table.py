"""The block table's int32 mirror always equals the list, whatever the block manager does."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from hydrant.engine.block_table import BlockTable, block_rows


def _check(table: BlockTable) -> None:
    assert table.array().dtype == np.int32
    assert table.array().tolist() == list(table)


def test_the_mirror_follows_every_kind_of_change_in_a_random_history() -> None:
    rng = random.Random(7)
    table = BlockTable()
    for _ in range(3000):
        op = rng.randrange(11)
        if op in (0, 1):
            table.append(rng.randrange(1000))
        elif op == 2:
            table.extend(rng.randrange(1000) for _ in range(rng.randrange(5)))
        elif op == 3 and table:
            table[rng.randrange(-len(table), len(table))] = rng.randrange(1000)  # copy-on-write
        elif op == 4 and table:
            start = rng.randrange(len(table))
            table[start : start + 2] = [rng.randrange(1000)]
        elif op == 5 and table:
            table.pop(rng.randrange(len(table)))
        elif op == 6:
            table.insert(rng.randrange(len(table) + 1), rng.randrange(1000))
        elif op == 7 and table:
            del table[rng.randrange(len(table))]
        elif op == 8 and rng.random() < 0.05:
            table.clear()
        elif op == 9:
            table += [rng.randrange(1000)]
        elif op == 10 and table and rng.random() < 0.1:
            table.remove(table[rng.randrange(len(table))])
        if rng.random() < 0.3:  # read only now and then, so stale stretches pile up
            _check(table)
    _check(table)


def test_a_write_inside_the_synced_prefix_is_seen() -> None:
    table = BlockTable(range(100))
    _check(table)
    table[3] = 999  # the copy-on-write site of the block manager
    table[-1] = 555
    assert table.array()[3] == 999 and table.array()[-1] == 555
    table.sort()
    _check(table)
    table.reverse()
    _check(table)
    table *= 2
    _check(table)


def test_a_copy_is_independent_and_pickles_as_a_block_table() -> None:
    parent = BlockTable([4, 5, 6])
    _check(parent)
    child = BlockTable(parent)
    child[0] = 9
    assert parent.array().tolist() == [4, 5, 6]
    assert child.array().tolist() == [9, 5, 6]
    copied = pickle.loads(pickle.dumps(child))
    assert isinstance(copied, BlockTable) and copied.array().tolist() == [9, 5, 6]


@pytest.mark.parametrize("width", [1, 3, 6])
def test_rows_are_cut_and_padded_with_block_zero(width: int) -> None:
    tables: list[list[int]] = [BlockTable([7, 8, 9, 10]), [1, 2], BlockTable()]
    expected = [(list(t) + [0] * width)[:width] for t in tables]
    rows = block_rows(tables, width)
    assert rows.dtype == np.int32 and rows.tolist() == expected
