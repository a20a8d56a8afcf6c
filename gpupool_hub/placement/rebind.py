"""Which bookings move when a batch scheduler put a job on other GPUs than the pool booked.

The pool chooses a node and guesses GPUs; Slurm binds the job's GPUs itself. Two jobs asked for at
nearly the same moment on one node (a half and a whole GPU) got the opposite GPUs: the pool's
fix-up for the first was refused because the second's booking stood on the GPU it really got, and
the whole-GPU job then waited in Slurm while the ledger charged it (issue 48.3). The bookings must
swap: what the mover takes from others, they get where the mover was. Pure: no I/O; the service
applies the moves to its pool and ledger in one step, or none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["SwapImpossible", "swap_moves"]


class SwapImpossible(ValueError):
    """The mover's new GPUs cannot be had by swapping (a count that differs, an index held twice)."""


def swap_moves(mover: str, old: Sequence[int], new: Sequence[int],
               others: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The new GPU indices of the mover and of each allocation of ``others`` (its indices on the same
    node) that holds any GPU the mover takes: the GPUs the mover leaves are given, in order, to those
    it takes from, so every booking keeps its count. Allocations the mover takes nothing from do not
    move. Whether the moved bookings still fit (a share next to another share) is the pool's to say."""
    if len(set(new)) != len(new) or len(new) != len(old):
        raise SwapImpossible(f"{mover} holds {len(old)} GPU(s), not {sorted(new)}")
    taken = sorted(set(new) - set(old))
    left = sorted(set(old) - set(new))
    given = dict(zip(taken, left))
    moves = {mover: tuple(sorted(new))}
    for alloc, indices in sorted(others.items()):
        if alloc == mover or not set(indices) & set(taken):
            continue
        moved = tuple(sorted(given.get(i, i) for i in indices))
        if len(set(moved)) != len(moved):
            raise SwapImpossible(f"{alloc} would hold GPU {moved} twice")
        moves[alloc] = moved
    return moves
