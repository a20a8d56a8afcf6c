"""Requests that name devices: ``required`` (must include) and ``preferred`` (include if possible).

Like go-gpuallocator's required devices: the service restoring a server, or
an admin pinning one, names GPUs by UUID. Kept apart from the hot path: a
request without pins never reaches this module.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .request import MILLI, Request


def device_slots(ns, uuids) -> Tuple[int, ...]:
    """The slots of ``ns`` that the UUIDs name (a MIG GPU's UUID names all its instances)."""
    out: List[int] = []
    for u in uuids:
        out.extend(ns.uuid_slots.get(u, ()))
    return tuple(sorted(set(out)))


def slot_takes(ns, s: int, req: Request) -> bool:
    """Whether slot ``s`` of the (possibly masked) node view can serve ``req`` right now."""
    if req.gpu_milli:
        need = ns.cap[s] if ns.slot_mig[s] is not None else req.gpu_milli  # a MIG instance goes whole
        return ns.cap[s] >= req.gpu_milli and ns.free[s] >= need
    return ns.whole[s] and ns.free[s] == MILLI


def pin_node(index: Dict[str, object], req: Request) -> Optional[object]:
    """The one node holding every required device, or None (unknown UUID, or spread over nodes)."""
    nodes = {index.get(u) for u in req.required}
    if len(nodes) != 1 or None in nodes:
        return None
    return next(iter(nodes))


def why_never(index: Dict[str, object], req: Request) -> Optional[str]:
    """Why a request with required devices can never be placed, or None if it could be on an empty node."""
    unknown = sorted(u for u in req.required if u not in index)
    if unknown:
        return f"no device with UUID {', '.join(unknown)} in this pool"
    ns = pin_node(index, req)
    if ns is None:
        return f"required devices {', '.join(sorted(req.required))} are not all on one node"
    node = ns.node
    if node.cpu_milli < req.cpu_milli or node.memory_mib < req.memory_mib:
        return f"node {ns.name}, which holds the required devices, is too small for {req.describe()}"
    for u in sorted(req.required):
        slots = ns.uuid_slots[u]
        if req.models is not None and not all(ns.slot_model[s] in req.models for s in slots):
            return f"required device {u} is not one of the allowed models"
        if req.gpus and not all(ns.whole[s] for s in slots):
            return f"required device {u} is a MIG GPU, which is never handed out whole"
        if req.gpu_milli and not any(ns.cap[s] >= req.gpu_milli for s in slots):
            return f"required device {u} is smaller than {req.gpu_milli} milli-GPU"
    return None


def keep_required(cands: list, node, req: Request) -> list:
    """The candidate views of ``node`` whose required devices are free enough now."""
    out = []
    for v in cands:
        if v.real is not node:
            continue
        if req.gpu_milli:
            ok = any(slot_takes(v, s, req) for s in device_slots(v, req.required))
        else:
            ok = all(slot_takes(v, s, req) for s in device_slots(v, req.required))
        if ok:
            out.append(v)
    return out


def keep_preferred(cands: list, req: Request) -> list:
    """The candidates holding the most usable preferred devices (all of them if none holds any)."""
    best = 0
    scored = []
    for v in cands:
        n = sum(1 for s in device_slots(v, req.preferred) if slot_takes(v, s, req))
        n = min(n, req.gpus or 1)
        scored.append((n, v))
        best = max(best, n)
    return [v for n, v in scored if n == best] if best else cands


def fraction_slot(ns, req: Request, default: int) -> int:
    """For a pinned fraction: the tightest usable required (else preferred) device, else ``default``."""
    for uuids in (req.required, req.preferred):
        usable = [s for s in device_slots(ns, uuids) if slot_takes(ns, s, req)]
        if usable:
            return min(usable, key=lambda s: (ns.free[s], s))
    return default


def whole_positions(ns, req: Request, pos_to_slot: Dict[int, int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(required, preferred) GPU positions among the free ones, for Topology.choose."""
    free_pos = set(pos_to_slot)
    req_pos = tuple(sorted({ns.slot_gpu[s] for s in device_slots(ns, req.required)} & free_pos))
    pref_pos = tuple(sorted({ns.slot_gpu[s] for s in device_slots(ns, req.preferred)} & free_pos))
    return req_pos, pref_pos
