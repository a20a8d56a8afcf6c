"""Whole nodes kept for declared shapes of several GPUs, before anyone asks for one. Pure.

Why: a request of eight GPUs starts only on a node with eight whole GPUs free at once. When
a pool fills, FGD gives the last such nodes to one-GPU servers and shares (they fit nowhere
else), and from then on a node is whole again only once every server on it has ended: on a
busy pool of shares, hours for most nodes. Draining nodes for the big request once it waits
(:mod:`..queue.drains`) cannot pick the node that empties first: which one does depends on
when servers end, which nothing the pool records tells well (docs/eta.md). First come, first
served did better there by accident: its stalls left nodes whole. So the pool keeps the
last ``KEEP_WHOLE`` nodes that can host a declared shape of k GPUs (a configured profile,
:meth:`.state.Pool.expect`) from requests of fewer GPUs: those wait, and the big request
finds a node at once. The FGD policy's own ``reserve`` only steers; this refuses.

It refuses only where the kept nodes are at most a quarter (``KEEP_SHARE``) of the nodes the
shape fits: on a hub of a few nodes, one kept node would be a large part of it, so there the
policy's reserve steers as before and nothing waits for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, FrozenSet, Optional

from .request import MILLI, Request, model_allowed
from .scarce import fits_empty

#: nodes kept able to host each declared shape of several GPUs. Four, as many as are drained
#: for one waiter of several GPUs (:data:`..queue.drains.DRAIN_NODES`): in the openb replay
#: (seed 42) one kept node brought 3 of 6 runs whose longest wait missed first come, first
#: served's within it, two nodes 3, four all 6 (docs/eta.md, "Starvation, issue 50")
KEEP_WHOLE = 4
#: the kept nodes may be at most this share of the nodes the shape fits
KEEP_SHARE = 0.25

Guard = tuple[int, Optional[FrozenSet[str]]]  # (whole GPUs, allowed models; None: any)


def guards(nodes: Sequence[Any], shapes: Iterable[Request], keep: int = KEEP_WHOLE,
           share: float = KEEP_SHARE) -> tuple[Guard, ...]:
    """The declared shapes of several whole GPUs (not pinned, not MIG) for which ``keep`` nodes
    are at most ``share`` of the nodes they fit when empty: (GPUs, models), fewest GPUs first."""
    if keep <= 0:
        return ()
    out: set[Guard] = set()
    for r in shapes:
        if r.gpus < 2 or r.gpu_milli or r.mig or r.required or r.preferred:
            continue
        home = sum(1 for ns in nodes if fits_empty(ns, r))
        if home and keep <= share * home:
            out.add((r.gpus, r.models))
    return tuple(sorted(out, key=lambda g: (g[0], sorted(g[1] or ()))))


def takes_whole(ns: Any, req: Request) -> int:
    """How many whole free GPUs of node ``ns`` placing ``req`` there takes (a share breaks a whole
    GPU only where no shared GPU has room for it). FGD's own reserve counts the same way."""
    if req.gpus:
        return req.gpus
    return 0 if any(req.gpu_milli <= v < MILLI for v in ns.free) else 1


def allowed(pool: Any, req: Request, candidates: list[Any], kept: tuple[Guard, ...],
            keep: int = KEEP_WHOLE) -> list[Any]:
    """The candidates ``req`` may take: not one of the last ``keep`` nodes with k whole free GPUs
    of a guarded shape of more GPUs than it asks (k) when it would leave fewer there. Empty
    when those are all it fits: it waits."""
    if not kept or req.mig or req.required or not (req.gpus or req.gpu_milli):
        return candidates
    mine = max(req.gpus, 1)
    live = [(k, models) for k, models in kept if k > mine and pool.nodes_with_whole(k, models) <= keep]
    if not live:
        return candidates
    out = []
    for ns in candidates:
        real = ns.real
        before = real.n_full
        after = before - takes_whole(real, req)
        if not any(before >= k > after and (models is None or real.model_key in models) for k, models in live):
            out.append(ns)
    return out


def kept_nodes(pool: Any, kept: tuple[Guard, ...], keep: int = KEEP_WHOLE) -> list[str]:
    """The nodes kept whole now: for each guard down to its last ``keep`` nodes, those nodes
    (what an admin sees free in the pool map while a one-GPU server waits)."""
    out: set[str] = set()
    for k, models in kept:
        if pool.nodes_with_whole(k, models) > keep:
            continue
        out.update(ns.name for ns in pool.nodes
                   if ns.n_full >= k and (models is None or ns.model_key in models))
    return sorted(out)


def withheld(pool: Any, req: Request, kept: tuple[Guard, ...], keep: int = KEEP_WHOLE) -> dict[str, int]:
    """Per GPU model, the whole free GPUs ``req`` may not take now because their nodes are kept
    for a shape of more GPUs: what the spawn page must not count as free for it (a one-GPU
    card that read "8 of 8 GPUs free" while its spawn queued told the user something untrue)."""
    out: dict[str, int] = {}
    for ns in _closed_to(pool, req, kept, keep):
        for model, n in _whole_free(ns, req).items():
            out[model] = out.get(model, 0) + n
    return out


def open_blocks(pool: Any, req: Request, kept: tuple[Guard, ...], keep: int = KEEP_WHOLE) -> dict[str, int]:
    """Per GPU model of which GPUs are kept from ``req`` (:func:`withheld`), the most whole free
    GPUs of that model on one node ``req`` may take; {} when none are kept from it.

    Why: the kept nodes are the pool's whole ones, so the pool's largest block is on them. A
    4-GPU card beside an 8-GPU profile read "free" from that block while no node open to it
    had four GPUs free, and its spawn queued. Walks the whole pool, only while GPUs are kept
    from a request of several GPUs."""
    if req.gpus < 2:
        return {}
    closed = {ns.name for ns in _closed_to(pool, req, kept, keep)}
    if not closed:
        return {}
    models = set()
    for name in closed:
        models.update(_whole_free(pool.by_name[name], req))
    out = dict.fromkeys(models, 0)
    for ns in pool.nodes:
        if ns.name in closed:
            continue
        for model, n in _whole_free(ns, req).items():
            if model in out and n > out[model]:
                out[model] = n
    return out


def _closed_to(pool: Any, req: Request, kept: tuple[Guard, ...], keep: int) -> list[Any]:
    """The kept nodes ``req`` may not take now."""
    return [ns for ns in (pool.by_name[name] for name in kept_nodes(pool, kept, keep))
            if not allowed(pool, req, [ns], kept, keep)]


def _whole_free(ns: Any, req: Request) -> dict[str, int]:
    """Per GPU model, the whole free GPUs of node ``ns`` that ``req`` accepts."""
    out: dict[str, int] = {}
    for s, pos in enumerate(ns.slot_gpu):
        if ns.whole[s] and ns.free[s] == MILLI and model_allowed(ns.slot_model[s], req.models):
            model = ns.node.gpus[pos].model
            out[model] = out.get(model, 0) + 1
    return out
