"""Carrying out a fair-share reclaim: after the grace, stop the borrowed servers
it preempts and release their allocations; the requester's retry then gets
the reserved GPUs.

A reclaim that ended before its deadline (the spawn was stopped or timed out
and the spawner cancelled it, or it stopped asking) stops nobody: the executor
drops abandoned reclaims first and checks before every victim."""

from __future__ import annotations

import asyncio
import logging

from tornado.ioloop import IOLoop

from ..common.hubapi import HubClient, HubError
from ..core.reclaims import Reclaim, Reclaims

log = logging.getLogger("gpupool.reclaims")


class ReclaimExecutor:
    """Runs reclaims on the event loop ``loop`` (set when the service starts): the
    reclaims unit announces them from the writer thread."""

    def __init__(self, hub: HubClient, reclaims: Reclaims, loop: IOLoop | None = None) -> None:
        self.hub = hub
        self.reclaims = reclaims
        self.loop = loop

    def schedule(self, reclaim: Reclaim) -> None:
        """Called by the reclaims unit for each new reclaim (on the writer thread)."""
        (self.loop or IOLoop.current()).add_callback(self.run, reclaim)  # thread-safe

    async def run(self, reclaim: Reclaim) -> None:
        delay = (reclaim.deadline - self.reclaims.clock()).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)
        await self.reclaims.expire.off_loop()  # a spawn that stopped asking keeps nobody waiting
        for victim in reclaim.victims:
            if self.reclaims.pending(reclaim.user, reclaim.server) is not reclaim:
                return  # cancelled meanwhile: the remaining victims keep their GPUs
            error = None
            try:
                await self.hub.stop_server(victim.user, victim.server)
            except HubError as e:  # released anyway: the GPUs are reassigned as announced
                error = str(e)
                log.error("Could not stop %s/%s to reclaim its borrowed GPUs: %s", victim.user, victim.server, e)
            await self.reclaims.preempt.off_loop(reclaim, victim, stopped=error is None, error=error)
