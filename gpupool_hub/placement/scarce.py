"""Scarce nodes last: the nodes that are the only home of a declared request shape are
allocated last, like Slurm's node ``Weight`` (big-memory nodes given out last).

A pool often has a few nodes of a larger kind (more CPU or memory per node, or a GPU
model few nodes hold). A declared shape (a configured profile, :meth:`Pool.expect`)
that fits only those nodes waits for one of them to drain when small servers have
filled them; FGD's typical-request mix cannot see that, since the big shape is rare.
So each node gets a *weight*: the number of nodes that the scarcest declared shape
it can host fits on, when that shape fits a minority of the pool (at most
``SCARCE_SHARE`` of the nodes); other nodes weigh as much as the whole pool. A
request goes to the heaviest nodes that can take it, and to lighter ones only when it
fits nowhere heavier: a small server lands on a big node only when it fits nowhere
else. Pure: the node list is fixed, so the weights are computed once per declaration.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from . import mig as mig_placement
from .request import Request, model_allowed

#: a declared shape whose nodes are at most this share of the pool makes them scarce
SCARCE_SHARE = 0.5


def fits_empty(ns: Any, req: Request) -> bool:
    """Whether ``req`` fits node ``ns`` when the node is empty (pinned: only its devices' node)."""
    n = ns.node
    if n.cpu_milli < req.cpu_milli or n.memory_mib < req.memory_mib:
        return False
    if req.mig:
        return mig_placement.fits_node(ns, req)
    if req.required and not all(u in ns.uuid_slots for u in req.required):
        return False
    slots = [s for s, mk in enumerate(ns.slot_model) if model_allowed(mk, req.models)]
    if req.gpus:
        return sum(1 for s in slots if ns.whole[s]) >= req.gpus
    if req.gpu_milli:
        return any(ns.cap[s] >= req.gpu_milli for s in slots)
    return True


def node_weights(nodes: Sequence[Any], shapes: Iterable[Request], share: float | None = None) -> list[int] | None:
    """Per node (by index ``ns.i``): how many nodes the scarcest declared shape it hosts fits
    on, if that shape fits at most ``share`` of them; ``len(nodes)`` otherwise. None when no
    declared shape is scarce (nothing to order)."""
    share = SCARCE_SHARE if share is None else share
    total = len(nodes)
    weights = [total] * total
    scarce = False
    seen: set[tuple[Any, ...]] = set()
    for r in shapes:
        if r.required or r.preferred:
            continue  # a pinned request names its node: not a shape of the pool
        key = (r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.models, r.mig)
        if key in seen:
            continue
        seen.add(key)
        home = [ns.i for ns in nodes if fits_empty(ns, r)]
        if home and len(home) <= share * total:
            scarce = True
            for i in home:
                if len(home) < weights[i]:
                    weights[i] = len(home)
    return weights if scarce else None


def heaviest(candidates: Sequence[Any], weights: list[int]) -> Sequence[Any]:
    """The candidates of the greatest weight (all of them when they weigh the same)."""
    top = max(weights[ns.i] for ns in candidates)
    out = [ns for ns in candidates if weights[ns.i] == top]
    return out if len(out) < len(candidates) else candidates
