"""Placing a request for one MIG instance of a given profile (``Request.mig``).

MIG instances are fixed partitions made by the admin (or the node agent's
layout): a 1g request can only take a free 1g instance, and taking it never
turns a 3g instance into something smaller. What a choice can spoil is the
*untouched* GPUs: a GPU with no instance in use can still serve anything its
layout offers, and an admin can re-partition it (say, to 1 × 7g for a big
job) without stopping anyone. So, in the spirit of the tight fit for
fractions, a MIG request goes

1. to the GPU with the fewest free compute slices (the most used one), so
   half-used GPUs fill up before an untouched one is broken into;
2. then to the node with the fewest free MIG slices, packing nodes the same way;
3. then to the GPU with the fewest free instances of the asked profile, so a
   GPU laid out for many small instances keeps them for the requests that
   come in numbers, and an odd leftover instance is used first;
4. then by the pool's seeded node order and the instance order.

Pure and separate from the policies: FGD and the baselines never see a MIG
request, so their behaviour for every other request is unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from ..mig import MigProfileError, parse_mig_profile, slices
from .hardware import MigDevice
from .request import Request, model_allowed

if TYPE_CHECKING:  # state.py imports this module
    from .state import NodeState

__all__ = ["choose", "fits_node", "free_instances", "instance_profile"]


def instance_profile(m: MigDevice) -> str:
    """The canonical profile of an inventory MigDevice (as written if not a standard name)."""
    try:
        return parse_mig_profile(m.profile)
    except MigProfileError:
        return m.profile.strip().lower()


def _slices_of(ns: NodeState, s: int) -> int:
    """Compute slices of slot ``s`` (from its profile; from its milli share where the name says none)."""
    m = ns.slot_mig[s]
    try:
        return slices(parse_mig_profile(m.profile))
    except MigProfileError:
        return max(1, round(ns.cap[s] * 7 / 1000))


def _free(ns: NodeState, s: int) -> bool:
    return ns.slot_mig[s] is not None and ns.free[s] == ns.cap[s]


def free_instances(ns: NodeState, req: Request) -> List[int]:
    """Slots of ``ns`` holding a free instance of ``req.mig`` on an allowed model (and required device)."""
    out = []
    for s, m in enumerate(ns.slot_mig):
        if m is None or not _free(ns, s) or instance_profile(m) != req.mig:
            continue
        if not model_allowed(ns.slot_model[s], req.models):
            continue
        if req.required and not (req.required & {m.uuid, ns.node.gpus[ns.slot_gpu[s]].uuid}):
            continue
        out.append(s)
    return out


def fits_node(ns: NodeState, req: Request) -> bool:
    """Whether ``ns`` could take ``req`` when empty (an instance of the profile, CPU and memory)."""
    node = ns.node
    if node.cpu_milli < req.cpu_milli or node.memory_mib < req.memory_mib:
        return False
    return any(m is not None and instance_profile(m) == req.mig and model_allowed(ns.slot_model[s], req.models)
               for s, m in enumerate(ns.slot_mig))


def _key(ns: NodeState, s: int, req: Request) -> Tuple[int, int, int, int, int, int]:
    gpu = ns.slot_gpu[s]
    gpu_free = node_free = same = 0
    for t, m in enumerate(ns.slot_mig):
        if m is None or not _free(ns, t):
            continue
        n = _slices_of(ns, t)
        node_free += n
        if ns.slot_gpu[t] == gpu:
            gpu_free += n
            same += instance_profile(m) == req.mig
    preferred = 0 if not req.preferred or req.preferred & {ns.slot_mig[s].uuid, ns.node.gpus[gpu].uuid} else 1
    return (preferred, gpu_free, node_free, same, ns.rank, s)


def choose(req: Request, candidates: Sequence[NodeState]) -> Optional[Tuple[NodeState, Tuple[int, ...]]]:
    """(node, (slot,)) for ``req`` among the candidate nodes (see the module doc), or None."""
    best = None
    best_key = None
    for ns in candidates:
        for s in free_instances(ns, req):
            key = _key(ns, s, req)
            if best_key is None or key < best_key:
                best, best_key = (ns, (s,)), key
    return best
