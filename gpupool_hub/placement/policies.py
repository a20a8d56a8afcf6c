"""Placement policies: which node, and which devices on it.

The interface (:class:`Policy`) and the device pickers live in ``base.py``;
the default policy, FGD, in ``fgd.py``. This module holds the simple
baselines and the registry that makes policies selectable by name.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Sequence

from .base import Choice, Policy, pick_fraction_slot, pick_slots, pick_whole_slots
from .fgd import FGD
from .request import Request

__all__ = [
    "BestFit", "Choice", "FGD", "FirstFit", "Policy", "RandomFit", "get_policy", "pick_fraction_slot",
    "pick_slots", "pick_whole_slots", "policy_names", "register_policy",
]


class FirstFit(Policy):
    """The first node in configuration order: the simple baseline."""

    name = "first-fit"

    def select(self, req: Request, candidates: Sequence) -> Choice:
        ns = candidates[0]
        return ns, pick_slots(ns, req)


class RandomFit(Policy):
    """A uniformly random node that fits (seeded): the paper's Random baseline."""

    name = "random"

    def bind(self, pool) -> None:
        super().bind(pool)
        self.rng = random.Random(pool.seed * 1_000_003 + self.seed)

    def select(self, req: Request, candidates: Sequence) -> Choice:
        ns = candidates[self.rng.randrange(len(candidates))]
        return ns, pick_slots(ns, req)


class BestFit(Policy):
    """The paper's Best-fit: the node left with the least weighted free CPU and GPU.

    Leftover = 0.5·(cpu_free − cpu_req)/max_cpu + 0.5·(gpu_free − gpu_req)/max_gpu,
    normalised by the largest node of the pool (128 CPUs and 8 GPUs on the
    openb trace, the paper's constants). Ties go to the seeded node order.
    """

    name = "best-fit"

    def select(self, req: Request, candidates: Sequence) -> Choice:
        pool = self.pool
        wc = 0.5 / pool.max_cpu
        wg = 0.5 / pool.max_gpu_milli
        c = req.cpu_milli
        g = req.total_gpu_milli
        best = None
        best_key = None
        for ns in candidates:
            key = (round(wc * (ns.cpu_free - c) + wg * (ns.total_free - g), 9), ns.rank)
            if best_key is None or key < best_key:
                best, best_key = ns, key
        return best, pick_slots(best, req)


_REGISTRY: Dict[str, Callable[..., Policy]] = {
    "first-fit": FirstFit,
    "best-fit": BestFit,
    "random": RandomFit,
    "fgd": FGD,
}


def register_policy(name: str, factory: Callable[..., Policy]) -> None:
    """Make a new policy available to :func:`get_policy` (and the hub config)."""
    _REGISTRY[name] = factory


def get_policy(name: str = "fgd", **kwargs) -> Policy:
    """A fresh policy instance by name: "first-fit", "best-fit", "random", "fgd" (default)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}") from None
    return factory(**kwargs)


def policy_names() -> List[str]:
    return sorted(_REGISTRY)
