"""Refresh: what the inventory source says now (Slurm's node states and jobs, which
node agents went silent), applied to the placement pool."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...slurm.commands import OutageLog, SlurmCommandError, controller_unreachable
from ...inventory.sources import InventorySource
from ..core.pool_inventory import PoolInventory

log = logging.getLogger("gpupool.inventory")


class InventoryRefreshJob:
    """Read the source's node status off the event loop; apply it on the writer thread."""

    def __init__(self, source: InventorySource, inventory: PoolInventory,
                 in_thread: Callable[..., Awaitable[Any]]) -> None:
        self.source = source
        self.inventory = inventory
        self.in_thread = in_thread
        self.outage = OutageLog(log)

    async def __call__(self) -> None:
        try:
            status = await self.in_thread(self.source.node_status)
        except SlurmCommandError as e:
            if not controller_unreachable(str(e)):
                raise
            # slurmctld restarting or down: the pool keeps Slurm's last word; said once, not every refresh
            self.outage.failed(str(e))
            return
        self.outage.ok()
        await self.inventory.apply_node_status.off_loop(status)
