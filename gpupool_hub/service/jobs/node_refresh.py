"""Refresh: what the inventory source says now (Slurm's node states and jobs, which
node agents went silent), applied to the placement pool."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...inventory.outage import OutageLog
from ...inventory.sources import InventorySource, SourceDown, SourceIncomplete
from ...ledger import Ledger
from ..core.pool_inventory import PoolInventory
from ..core.rebinds import Rebinds

log = logging.getLogger("gpupool.inventory")


class InventoryRefreshJob:
    """Read the source's node status off the event loop; apply it on the writer thread.

    A GPU the scheduler gave whole to one job while another holds shards of it (Slurm 22.05's lost
    shards, ``slurm/shared.py``) is said once, as a WARNING, while it lasts (the pool map shows it as
    the node's problem), and a hub allocation holding it whole is charged only what is left of the
    GPU beside the shards (``Rebinds.share_what_is_left``)."""

    def __init__(self, source: InventorySource, inventory: PoolInventory,
                 in_thread: Callable[..., Awaitable[Any]], rebinds: Rebinds | None = None,
                 ledger: Ledger | None = None) -> None:
        self.source = source
        self.inventory = inventory
        self.in_thread = in_thread
        self.rebinds = rebinds
        self.ledger = ledger
        self.outage = OutageLog(log)
        self.incomplete = False  # the last answer was incomplete (said once)
        self._shared: set[tuple[str, int, tuple[int, ...]]] = set()

    async def __call__(self) -> None:
        try:
            status = await self.in_thread(self.source.node_status)
        except SourceDown as e:
            # slurmctld restarting or down: the pool keeps Slurm's last word; said once, not every refresh
            self.outage.failed(str(e))
            return
        except SourceIncomplete as e:
            # a slurmctld that just restarted answers for a few seconds without GPU indices (issue 48.9:
            # an ERROR with a traceback after each restart): the pool keeps Slurm's last word; said once
            if not self.incomplete:
                log.warning("slurmctld's answer is incomplete (as while it restarts): %s; the pool keeps Slurm's "
                            "last word until it answers in full", e)
            self.incomplete = True
            return
        if self.incomplete:
            log.info("slurmctld answers in full again")
            self.incomplete = False
        self.outage.ok()
        await self.inventory.apply_node_status.off_loop(status)
        await self._shared_gpus([g for st in status.values() for g in st.shared])

    async def _shared_gpus(self, shared: list[Any]) -> None:
        seen = set()
        for gpu in shared:
            key = (gpu.node, gpu.index, gpu.whole_jobs)
            seen.add(key)
            if key not in self._shared:
                log.warning("Node %s: %s", gpu.node, gpu.describe())
            if self.rebinds is None or self.ledger is None:
                continue
            for alloc in gpu.whole_allocations:
                try:
                    await self.rebinds.share_what_is_left.off_loop(self.ledger, alloc, gpu.index, gpu.left_milli)
                except (LookupError, ValueError) as e:
                    if key not in self._shared:
                        log.warning("Allocation %s shares GPU %s of %s but could not be charged as a share: %s",
                                    alloc, gpu.index, gpu.node, e)
        for key in self._shared - seen:
            log.info("Node %s: GPU %s is no longer shared between a whole-GPU job and shard jobs", key[0], key[1])
        self._shared = seen
