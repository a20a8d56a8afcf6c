"""What the pool looks like, for people: the allocation map behind ``GET pool``,
the free summary behind a "no capacity" message, and the one-line description
of a placement in the spawn progress. Read-only views of :class:`~.state.Pool`,
kept apart from the state changes so that each stays small."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from ..money.units import plural
from .request import MILLI

if TYPE_CHECKING:
    from .state import Placement, Pool


def snapshot(pool: "Pool", names: "Optional[Iterable[str]]" = None) -> List[Dict[str, Any]]:
    """Per node and per GPU: model, allocated milli and holders, for the allocation map API;
    only the nodes ``names`` (in that order, unknown ones left out) when given."""
    out = []
    for ns in pool.nodes if names is None else [pool.by_name[n] for n in names if n in pool.by_name]:
        n = ns.node
        gpus = []
        for pos, g in enumerate(n.gpus):
            slots = [s for s, p in enumerate(ns.slot_gpu) if p == pos]
            holders: Dict[str, int] = {}
            for s in slots:
                holders.update(ns.holders[s])
            entry: Dict[str, Any] = {
                "index": g.index, "uuid": g.uuid, "model": g.model,
                "allocated_milli": sum(ns.cap[s] - ns.free[s] for s in slots),
                "holders": holders,
            }
            if g.mig:
                entry["mig"] = [
                    {"uuid": ns.slot_mig[s].uuid, "profile": ns.slot_mig[s].profile,  # type: ignore[union-attr]
                     "milli": ns.cap[s], "holders": dict(ns.holders[s])}
                    for s in slots
                ]
            gpus.append(entry)
        out.append({
            "node": n.name, "labels": dict(n.labels),
            "cpu_milli": n.cpu_milli, "cpu_free": ns.cpu_free,
            "memory_mib": n.memory_mib, "memory_free": ns.mem_free,
            "gpus": gpus,
        })
    return out

def held_per_model(pool: "Pool") -> "tuple[Dict[str, Dict[str, int]], Dict[str, int]]":
    """Per GPU model its nodes, GPUs, MIG-split GPUs and the milli held of them; and the GPU
    milli each allocation holds across the pool. What a summary of a large pool needs, in
    one pass over its slots (a :func:`snapshot` of 10,000 GPUs builds 10,000 dicts first)."""
    per: Dict[str, Dict[str, int]] = {}
    by_alloc: Dict[str, int] = {}
    for ns in pool.nodes:
        seen = set()
        for g in ns.node.gpus:
            e = per.get(g.model)
            if e is None:
                e = per[g.model] = {"nodes": 0, "gpus": 0, "mig_gpus": 0, "held_milli": 0}
            e["gpus"] += 1
            e["mig_gpus"] += bool(g.mig)
            if g.model not in seen:
                seen.add(g.model)
                e["nodes"] += 1
        gpus = ns.node.gpus
        for s, pos in enumerate(ns.slot_gpu):
            held = ns.cap[s] - ns.free[s]
            if held:
                per[gpus[pos].model]["held_milli"] += held
                for alloc, milli in ns.holders[s].items():
                    by_alloc[alloc] = by_alloc.get(alloc, 0) + milli
    return per, by_alloc


def free_summary(pool: "Pool") -> "FreeSummary":
    """What is free right now, per GPU model: the words behind a "no capacity" message."""
    per: Dict[str, Dict[str, int]] = {}
    for ns in pool.nodes:
        for pos, g in enumerate(ns.node.gpus):
            e = per.setdefault(g.model, {"whole_free": 0, "largest_whole_block": 0,
                                         "largest_share_milli": 0, "free_milli": 0, "nodes": 0})
        seen = set()
        for s, pos in enumerate(ns.slot_gpu):
            model = ns.node.gpus[pos].model
            e = per[model]
            if model not in seen:
                e["nodes"] += 1
                seen.add(model)
            e["free_milli"] += ns.free[s]
            if ns.whole[s] and ns.free[s] == MILLI:
                e["whole_free"] += 1
            if 0 < ns.free[s] < ns.cap[s]:  # the biggest piece of an already shared device
                e["largest_share_milli"] = max(e["largest_share_milli"], ns.free[s])
        for model in seen:
            block = sum(1 for s, pos in enumerate(ns.slot_gpu)
                        if ns.node.gpus[pos].model == model and ns.whole[s] and ns.free[s] == MILLI)
            per[model]["largest_whole_block"] = max(per[model]["largest_whole_block"], block)
    cpu_free = max((ns.cpu_free for ns in pool.nodes), default=0)
    mem_free = max((ns.mem_free for ns in pool.nodes), default=0)
    return FreeSummary(per_model=per, largest_cpu_free=cpu_free, largest_memory_free=mem_free)

def describe(pool: "Pool", placement: Placement) -> str:
    """One line for the spawn progress message, e.g. "node-a, GPUs 2+3 joined by NVLink"."""
    if not placement.gpus:
        return f"{placement.node}, no GPU"
    ns = pool.by_name.get(placement.node)
    if len(placement.gpus) == 1:
        g = placement.gpus[0]
        if g.mig_profile:
            return f"{placement.node}, MIG {g.mig_uuid} ({g.mig_profile}) of GPU {g.index} ({g.model})"
        if g.milli < MILLI:
            where = f"MIG {g.mig_uuid} of GPU {g.index}" if g.mig_uuid else f"GPU {g.index}"
            return f"{placement.node}, {g.milli / 10:g}% of {where} ({g.model})"
        return f"{placement.node}, GPU {g.index} ({g.model})"
    idx = "+".join(str(g.index) for g in placement.gpus)
    how = ""
    if ns is not None:
        try:
            pos = [ns.node.gpu_position(g.index) for g in placement.gpus]
            how = ns.node.topology.describe_set(pos) if ns.node.links else ""
        except KeyError:
            how = ""
    return f"{placement.node}, GPUs {idx}" + (f" {how}" if how else "") + f" ({placement.gpus[0].model})"


@dataclass(frozen=True)
class FreeSummary:
    per_model: Dict[str, Dict[str, int]]
    largest_cpu_free: int
    largest_memory_free: int

    def __str__(self) -> str:
        if not self.per_model:
            return "no GPUs in this pool"
        parts = []
        for model, e in sorted(self.per_model.items()):
            share = e["largest_share_milli"]
            parts.append(
                f"{model}: {plural(e['whole_free'], 'whole GPU')} free, at most {e['largest_whole_block']} on one node"
                + (f", largest share {share / 10:g}% of a shared GPU" if share else "")
            )
        return "; ".join(parts)

    def as_dict(self) -> Dict[str, Any]:
        return {"per_model": self.per_model, "largest_cpu_free": self.largest_cpu_free,
                "largest_memory_free": self.largest_memory_free}
