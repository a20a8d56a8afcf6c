"""The policy interface and the device pickers every policy shares.

A policy is one class with one required method, :meth:`Policy.select`, or
more simply :meth:`Policy.score` (higher is better) and the base class does
the rest: argmax over the nodes that fit, ties broken by the pool's seeded
random node order, devices picked by :func:`pick_slots`. ``observe`` lets a
policy learn the request mix; ``bind`` is called once with the pool.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from . import pins
from .mix import DEFAULT_FLOOR_WEIGHT, DEFAULT_RESERVE, Expected, RequestMix, check_reserve
from .request import MILLI, Request

Choice = Tuple["NodeState", Tuple[int, ...]]  # noqa: F821  (NodeState from .state)


# ---------------------------------------------------------------------------
# Devices inside a node
# ---------------------------------------------------------------------------

def pick_fraction_slot(ns, f: int, models=None) -> int:
    """The device whose free share fits ``f`` most tightly.

    Tight fit keeps the emptier devices (above all, the whole free GPUs) for
    requests that need them: fractions share GPUs with other fractions before
    they break a whole GPU.
    """
    best = -1
    best_free = MILLI + 1
    free = ns.free
    cap = ns.cap
    for s in range(len(free)):
        v = free[s]
        if v >= f and cap[s] >= f and v < best_free and (models is None or ns.slot_model[s] in models):
            best, best_free = s, v
    return best


def pick_whole_slots(ns, k: int, models=None, req: Optional[Request] = None) -> Tuple[int, ...]:
    """``k`` wholly free GPUs, chosen for NVLink/PCIe closeness (see Topology.choose).

    With a pinned ``req``, its required GPUs are in the set and its preferred
    ones come next.
    """
    free = ns.free
    whole = ns.whole
    pos_to_slot = {}
    for s in range(len(free)):
        if whole[s] and free[s] == MILLI and (models is None or ns.slot_model[s] in models):
            pos_to_slot[ns.slot_gpu[s]] = s
    if req is not None and req.pinned:
        required, preferred = pins.whole_positions(ns, req, pos_to_slot)
        chosen = ns.node.topology.choose(tuple(pos_to_slot), k, required, preferred)
    else:
        chosen = ns.node.topology.choose(tuple(pos_to_slot), k)
    return tuple(pos_to_slot[p] for p in chosen)


def pick_slots(ns, req: Request) -> Tuple[int, ...]:
    """The devices for ``req`` on node ``ns``: tightest share for a fraction, best-connected set otherwise."""
    if req.gpu_milli:
        slot = pick_fraction_slot(ns, req.gpu_milli, req.models)
        return (pins.fraction_slot(ns, req, slot) if req.pinned else slot,)
    if req.gpus:
        return pick_whole_slots(ns, req.gpus, req.models, req)
    return ()


# ---------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------

class Policy:
    """Base class; subclass and override :meth:`score` or :meth:`select`."""

    name = "base"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.pool = None

    def bind(self, pool) -> None:
        """Called once by the Pool that owns this policy instance."""
        self.pool = pool

    def observe(self, req: Request) -> None:
        """Every request the pool sees (placed or not); default: ignore."""

    def expect(self, shapes: Expected, floor_weight: float = DEFAULT_FLOOR_WEIGHT,
               reserve: int = DEFAULT_RESERVE) -> None:
        """Request shapes the caller declares may come (see :meth:`Pool.expect`).

        Policies that do not model the request mix have no use for them; the
        declaration is still validated, so a bad one fails whatever the policy.
        """
        check_reserve(reserve)
        RequestMix().expect(shapes, floor_weight)

    def score(self, ns, req: Request) -> float:
        raise NotImplementedError

    def select(self, req: Request, candidates: Sequence) -> Choice:
        """Choose among ``candidates`` (all fit ``req`` now); return (node, device slots)."""
        best = None
        best_key = None
        for ns in candidates:
            key = (self.score(ns, req), -ns.rank)
            if best_key is None or key > best_key:
                best, best_key = ns, key
        return best, pick_slots(best, req)
