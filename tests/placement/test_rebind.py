"""Issue 48.3: the bookings that move when Slurm bound a job to other GPUs than the pool booked (table tests)."""

from __future__ import annotations

import pytest

from gpupool_hub.placement.rebind import SwapImpossible, swap_moves


@pytest.mark.parametrize("old, new, others, expected", [
    # the issue's case: the half was booked on 0, the whole on 1; Slurm gave them the opposite GPUs
    ([0], [1], {"whole": [1]}, {"m": (1,), "whole": (0,)}),
    ([1], [1], {"whole": [0]}, {"m": (1,)}),  # already right: nothing else moves
    ([0], [2], {"a": [1], "b": [3]}, {"m": (2,)}),  # a free GPU: nobody else moves
    ([0, 1], [1, 2], {"x": [2], "y": [3]}, {"m": (1, 2), "x": (0,)}),  # keeps 1, takes 2 from x, gives it 0
    ([0, 1], [2, 3], {"x": [2, 3]}, {"m": (2, 3), "x": (0, 1)}),  # two GPUs each way
    ([0], [1], {"half": [1], "other half": [1]}, {"m": (1,), "half": (0,), "other half": (0,)}),  # shares
    ([0, 1], [1, 2], {"x": [2, 3]}, {"m": (1, 2), "x": (0, 3)}),
], ids=["opposite", "same", "free", "partial", "pair", "two shares", "keeps its own"])
def test_swap_moves(old, new, others, expected):
    assert swap_moves("m", old, new, others) == expected


@pytest.mark.parametrize("old, new, others", [
    ([0], [1, 2], {}),  # a count that differs
    ([0, 1], [2, 2], {}),  # an index twice
])
def test_impossible_swaps(old, new, others):
    with pytest.raises(SwapImpossible):
        swap_moves("m", old, new, others)
