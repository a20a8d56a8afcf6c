"""Held allocations whose GPUs the placement pool does not have (issue 37.7c).

A server may hold GPUs that the pool, as built at start-up, lacks: a Slurm GRES
type missing from ``c.GPUPool.slurm_gpu_models`` (its GPUs are left out of the
pool), a node taken out of ``c.GPUPool.nodes``, a GPU its agent reports with
another UUID. Releasing such an allocation at start-up lost it for good: the
server kept running, once the map was fixed its GPU was "held outside the hub"
(Slurm says it is in use, and no allocation held it), and the reconcile job
logged an ERROR at every run for a server whose allocation the pool did not know.

So the allocation stays held in the ledger (charged as the usage source
charges it, node agents let its server use it) and outside the pool, where nobody can be given
its GPUs since the pool does not have them; the pool takes it back as soon as it
has those GPUs (the next start-up with the map fixed, or with the agents
inventory the report that brings them). What an admin must fix is said in one
WARNING, then again only when it changes: not at every inventory refresh.

:class:`UnplacedAllocations` is a helper that ``PoolInventory`` builds and holds;
only its own methods change it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ...inventory.sources import InventorySource
from ...placement.state import Placement, Pool

log = logging.getLogger("gpupool.inventory")

__all__ = ["Unplaced", "UnplacedAllocations", "missing_hardware"]


@dataclass(frozen=True)
class Unplaced:
    """One held allocation outside the pool: whose, where, and which of its GPUs the pool lacks."""

    who: str  # "alice/train" (user/server)
    placement: Placement
    missing: str  # "node gpu-c has no GPU 1 (NVIDIA GeForce RTX 3090)"


def missing_hardware(pool: Pool, placement: Placement) -> str | None:
    """Which of ``placement``'s node and GPUs the pool lacks (None: it has them all).

    A GPU counts as there when its node has a GPU of that index with the same UUID
    (and MIG instance): what ``Pool.restore`` looks up. Free or not does not matter
    here; a GPU that is there but taken twice is a conflict, not missing hardware."""
    ns = pool.by_name.get(placement.node)
    if ns is None:
        return f"node {placement.node} is not in the pool"
    have = {(g.index, g.uuid, None) for g in ns.node.gpus}
    have |= {(g.index, g.uuid, m.uuid) for g in ns.node.gpus for m in g.mig}
    lacking = [g for g in placement.gpus if (g.index, g.uuid, g.mig_uuid) not in have]
    if not lacking:
        return None
    return f"node {placement.node} has no " + ", ".join(
        f"GPU {g.index}" + (f" MIG {g.mig_uuid}" if g.mig_uuid else "") + f" ({g.model}, {g.uuid})" for g in lacking)


def fix_hint(source: InventorySource | None) -> str:
    """Where the pool's hardware comes from, for a node whose source names no problem."""
    return (source or InventorySource()).hardware_hint


class UnplacedAllocations:
    """Held allocations kept out of the pool, and what was last said about them."""

    def __init__(self, hint: str) -> None:
        self.hint = hint
        self._held: dict[str, Unplaced] = {}
        self._said: dict[str, str] = {}  # allocation id -> the words of the last warning

    def __contains__(self, alloc_id: object) -> bool:
        return alloc_id in self._held

    def items(self) -> list[tuple[str, Unplaced]]:
        return list(self._held.items())

    def keep(self, alloc_id: str, who: str, placement: Placement, missing: str) -> None:
        self._held[alloc_id] = Unplaced(who, placement, missing)

    def adopted(self, alloc_id: str, where: str) -> None:
        """The pool holds ``alloc_id`` again (its GPUs are back): said once, at INFO."""
        u = self._held.pop(alloc_id, None)
        self._said.pop(alloc_id, None)
        if u is not None:
            log.info("Allocation %s of %s is back in the placement pool: %s", alloc_id, u.who, where)

    def forget(self, alloc_id: str) -> None:
        """``alloc_id`` was released: nothing to take back into the pool, nothing more to say."""
        self._held.pop(alloc_id, None)
        self._said.pop(alloc_id, None)

    def say(self, problems: Mapping[str, str]) -> None:
        """One WARNING naming what an admin must fix, for the allocations whose words changed
        since the last one (``problems``: the inventory source's per node, e.g. Slurm's
        unmapped GRES type); nothing when none did, however often the inventory refreshes."""
        words = {a: self._words(a, u, problems) for a, u in self._held.items()}
        changed = [words[a] for a in sorted(words) if self._said.get(a) != words[a]]
        self._said = words
        if changed:
            log.warning("%d held allocation(s) stay in the ledger but outside the placement pool, which lacks "
                        "their GPUs: %s. Their servers keep them, as the ledger says; nobody else is placed on "
                        "GPUs the pool lacks. Each goes back into the pool once the pool has its GPUs (after "
                        "the fix, restart the service; a hub-managed one restarts with the hub). Said again only when "
                        "this changes.",
                        len(changed), " | ".join(changed))

    def _words(self, alloc_id: str, u: Unplaced, problems: Mapping[str, str]) -> str:
        node = u.placement.node
        fix = f"node {node}: {problems[node]}" if node in problems else self.hint
        return f"allocation {alloc_id} of {u.who}: {u.missing}; {fix}"
