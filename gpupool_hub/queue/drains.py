"""Nodes drained for old waiters of several whole GPUs (:func:`.dispatch.dispatch`). Pure.

Why: such a request starts only where that many GPUs of one node are free at once; GPUs
free one at a time all over the pool and backfill gives each to the next small waiter, so
a request that fits more nodes than old waiters may close waited for its one reserved node
while every other node was refilled (in the openb replay the longest waits, 8-GPU pods,
were worse than first come, first served's). Slurm's backfill promises the queue's head
that no later job delays its reserved start; servers here have no time limit, so the
promise is a node on which nothing but such waiters start, in queue order.

Which nodes: those that lack least for the waiter now (GPUs, then CPU, then memory), then
those with fewer GPUs in all (big nodes stay for big requests), then by name.
"""

from __future__ import annotations

from ..placement.request import MILLI, Request, model_allowed
from ..placement.state import Pool
from .order import Waiter

#: nodes drained for each old waiter of several whole GPUs that does not fit (see :func:`.dispatch.dispatch`): it
#: takes the first of them to empty. Four, not tuned further: one drained node waited as long as its longest
#: server (the openb replay's ``default+share`` at 1.1: longest wait 1,113 -> 1,174 s), sixteen raised wait
#: p95 by half at load 1.3 (docs/eta.md, "Starvation, issue 50")
DRAIN_NODES = 4


def needs_drain(w: Waiter) -> bool:
    """Whether ``w`` waits for a node to drain: several whole GPUs of one node (not pinned, not
    MIG), which single GPUs freeing here and there never give while backfill refills them."""
    return w.size[0] is not None and w.request.gpus > 1


def node_gpus(w: Waiter) -> int:
    """How many whole GPUs of one node ``w`` waits for: its GPUs if it waits for a drain, else 1
    (one GPU, a share, a pinned or MIG device: any that frees may be its)."""
    return w.request.gpus if needs_drain(w) else 1


def lacking(pool: Pool, name: str, req: Request) -> tuple[int, int, int]:
    """What node ``name`` lacks now for ``req``: (whole GPUs, CPU, memory), each 0 when enough."""
    ns = pool.by_name[name]
    whole = sum(1 for s, mk in enumerate(ns.slot_model)
                if model_allowed(mk, req.models) and ns.whole[s] and ns.free[s] == MILLI)
    return max(0, req.gpus - whole), max(0, req.cpu_milli - ns.cpu_free), max(0, req.memory_mib - ns.mem_free)


def drain_nodes(pool: Pool, req: Request, fits: frozenset[str], taken: set[str] | frozenset[str],
                k: int) -> frozenset[str]:
    """The ``k`` nodes to drain for ``req`` among ``fits`` but those ``taken``: those that lack least
    for it now (they drain soonest), then with fewer GPUs (big nodes stay for big requests), then
    by name."""
    if k <= 0:
        return frozenset()
    ranked = sorted((lacking(pool, name, req), len(pool.by_name[name].cap), name) for name in fits
                    if name not in taken)
    return frozenset(name for _, _, name in ranked[:k])
