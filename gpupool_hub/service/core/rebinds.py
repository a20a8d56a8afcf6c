"""Rebinds: the pool's bookings follow the GPUs a batch scheduler really bound (issue 48.3).

The pool picks a node and guesses the GPUs; Slurm binds the job's GPUs itself, and a share
(``gres/shard``) goes where Slurm found shards. The spawner reports the job's GPUs
(``PATCH allocations/{id}``) and the allocation moves there. When another allocation of the node
stands on those GPUs (a half and a whole GPU asked for at nearly the same moment got the
opposite GPUs), the two swap (:func:`~gpupool_hub.placement.rebind.swap_moves`): both move in
the pool and in the ledger in one step, or neither does. A refusal names the allocations that
really hold the GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...ledger import AllocationRecord, Ledger
from ...placement.rebind import SwapImpossible, swap_moves
from ...placement.request import MILLI
from ...placement.errors import PlacementError
from ...placement.state import GPUShare, Placement
from .pool_inventory import PoolInventory
from .threads import CoreThreads, writes

log = logging.getLogger("gpupool.inventory")


class Rebinds:
    """Moves allocations to the GPUs their jobs were bound to; the pool's own state changes only
    through its ``release`` and ``restore``."""

    def __init__(self, inventory: PoolInventory, *, threads: CoreThreads | None = None) -> None:
        self.inventory = inventory
        self.threads = threads

    @writes
    def rebind(self, ledger: Ledger, alloc_id: str, indices: list[int]) -> AllocationRecord:
        """Record the GPUs a server's job really got (same node, same models, same count), swapping with
        the allocations that stand on them whose own jobs have not started yet (pending: their GPUs are
        the pool's guess still). ``ValueError`` (with a message for the caller) when they do not fit or
        a started job holds them; ``LookupError`` when the allocation is not held."""
        record = ledger.allocations.get(alloc_id)
        if record is None or record.released_at is not None:
            raise LookupError(f"no held allocation {alloc_id!r}")
        gpus = self._node_gpus(record, indices)
        if sorted(g["index"] for g in record.gpus) == sorted(indices):
            return record
        pool = self.inventory.pool
        held = {a.id: a for a in ledger.allocations.active_on(nodes=[record.node]) if a.id in pool}
        confirmed = [a for a, r in held.items() if a != alloc_id and r.charged_from is not None
                     and set(indices) & {g["index"] for g in r.gpus}]
        if confirmed:  # a booking its own job confirmed (its start reported) never moves: Slurm's word
            raise ValueError(self._refusal(record, indices, {alloc_id: (), **{a: () for a in confirmed}},
                                           "their jobs run there"))
        try:
            moves = swap_moves(alloc_id, [g["index"] for g in record.gpus], indices,
                               {a: [g["index"] for g in r.gpus] for a, r in held.items()})
        except SwapImpossible as e:
            raise ValueError(str(e)) from None
        records = {a: held.get(a) or record for a in moves}
        for a, new in moves.items():  # a swap moves GPUs of the same models only
            if sorted(gpus[i].model for i in new) != sorted(g["model"] for g in records[a].gpus):
                raise ValueError(self._refusal(record, indices, moves, "their models differ"))
        rebound = {a: _rebound(records[a].gpus, {i: gpus[i] for i in new}) for a, new in moves.items()}
        self._apply(record.node, records, rebound, indices, moves)
        ledger.allocations.set_gpus_of(rebound)
        for a, new in moves.items():
            log.info("Allocation %s rebound to GPUs %s of %s (as the scheduler bound %s)", a, list(new),
                     record.node, "it" if a == alloc_id else f"{alloc_id}: a swap")
        return ledger.allocations.get(alloc_id)  # type: ignore[return-value]

    @writes
    def share_what_is_left(self, ledger: Ledger, alloc_id: str, index: int, milli: int) -> AllocationRecord:
        """A whole-GPU allocation whose job Slurm put on GPU ``index``, which shard jobs hold too (Slurm
        22.05's lost shards, ``slurm/shared.py``): booked, and charged, as the ``milli`` of the GPU left
        beside the shards, on that GPU. ``ValueError`` when nothing is left or it does not fit."""
        record = ledger.allocations.get(alloc_id)
        if record is None or record.released_at is not None:
            raise LookupError(f"no held allocation {alloc_id!r}")
        if len(record.gpus) != 1 or record.gpus[0].get("mig_uuid"):
            raise ValueError("only an allocation of one whole GPU is charged as what is left of it")
        [held] = record.gpus
        if held["index"] == index and held["milli"] == milli:
            return record
        if not 0 < milli < MILLI:
            raise ValueError(f"{milli} milli of GPU {index} is left beside its shards")
        gpus = self._node_gpus(record, [index])
        moved = ({**held, "index": index, "uuid": gpus[index].uuid, "model": gpus[index].model, "milli": milli,
                  "share": held.get("share") or "timeslice"},)
        self._apply(record.node, {alloc_id: record}, {alloc_id: moved}, [index], {alloc_id: (index,)})
        ledger.allocations.set_gpus_of({alloc_id: moved})
        log.warning("Allocation %s of %s/%s shares GPU %s of %s with shard jobs: charged as the %s of it that is "
                    "left", alloc_id, record.user, record.server, index, record.node, f"{milli / MILLI:g}")
        return ledger.allocations.get(alloc_id)  # type: ignore[return-value]

    def _node_gpus(self, record: AllocationRecord, indices: list[int]) -> dict[int, Any]:
        ns = self.inventory.pool.by_name.get(record.node)
        if ns is None:
            raise ValueError(f"node {record.node!r} is not in the pool")
        if len(set(indices)) != len(indices) or len(indices) != len(record.gpus):
            raise ValueError(f"allocation {record.id} holds {len(record.gpus)} GPU(s); got indices {indices}")
        if any(g.get("mig_uuid") for g in record.gpus) or (
                len(record.gpus) > 1 and any(g.get("milli", MILLI) != MILLI for g in record.gpus)):
            raise ValueError("only whole GPUs or a share of one GPU can be rebound")
        gpus = {g.index: g for g in ns.node.gpus}
        unknown = [i for i in indices if i not in gpus]
        if unknown:
            raise ValueError(f"node {record.node} has no GPU {unknown[0]}")
        if sorted(gpus[i].model for i in indices) != sorted(g["model"] for g in record.gpus):
            raise ValueError(f"GPUs {sorted(indices)} of {record.node} are not the allocation's models "
                             f"{sorted(g['model'] for g in record.gpus)}")
        return gpus

    def _apply(self, node: str, records: Mapping[str, AllocationRecord], rebound: Mapping[str, Sequence[dict]],
               indices: list[int], moves: Mapping[str, Sequence[int]]) -> None:
        """Move every booking in the pool, or none (the old ones are put back)."""
        pool, inventory = self.inventory.pool, self.inventory
        inventory.drop_placeholders(node)
        old = {a: pool.release(a) for a in moves if a in pool}
        done: list[str] = []
        try:
            for a, gpus in rebound.items():
                r = records[a]
                pool.restore(a, Placement(node=node, gpus=tuple(GPUShare(g["index"], g["uuid"], g["model"], g["milli"])
                                                               for g in gpus),
                                          cpu_milli=r.request.get("cpu_milli", 0),
                                          memory_mib=r.request.get("memory_mib", 0)))
                done.append(a)
        except PlacementError:
            for a in done:
                pool.release(a)
            for a, placement in old.items():
                pool.restore(a, placement)
            raise ValueError(self._refusal(records[next(iter(moves))], indices, moves, "they do not fit")) from None
        finally:
            inventory.apply_node_status(inventory.node_status)

    def _refusal(self, record: AllocationRecord, indices: list[int], moves: Mapping[str, Sequence[int]],
                 why: str) -> str:
        """Why the GPUs cannot be had, naming the allocations that hold them (not the mover)."""
        holders = [a for a in moves if a != record.id]
        on = f", held by {', '.join(holders)}" if holders else ""
        return (f"GPUs {sorted(indices)} of {record.node} cannot be given to allocation {record.id}{on}: "
                f"swapping the bookings fails, {why}")


def _rebound(old: Sequence[dict], gpus: Mapping[int, Any]) -> tuple[dict, ...]:
    """An allocation's devices moved to ``gpus`` (index -> the node's GPU): whole GPUs, or one share
    that keeps its size and class ("milli", "share") on the GPU whose shards the job got."""
    if len(old) == 1 and old[0].get("milli", MILLI) != MILLI:
        [(i, g)] = gpus.items()
        return ({**old[0], "index": i, "uuid": g.uuid, "model": g.model},)
    return tuple({"index": i, "uuid": g.uuid, "model": g.model, "milli": MILLI, "mig_uuid": None}
                 for i, g in sorted(gpus.items()))
