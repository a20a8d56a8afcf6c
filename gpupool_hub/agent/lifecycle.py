"""How the node agent runs and stops: its loop, its signals, its metrics port, its node's lease.

A stop (SIGTERM, SIGINT) waits at most FINISH_GRACE for the tick in flight, and a hard exit
follows ``STOP_DEADLINE`` seconds later should anything hang
(``gpupool_hub/lifetime.py``). The metrics port is taken back from an older
agent of this node (one that hung, one started by hand); held by anything
else, the agent stops at once naming that process (``scrape.py``, which also
says who may read it). On its way out the agent
gives its node up at the service (``service/core/agentlease.py``), so a
successor is served at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..lifetime import exit_hard_later
from .scrape import open_endpoint

if TYPE_CHECKING:
    from .app import GPUPoolAgent

log = logging.getLogger("gpupool.agent")

#: the exit status of an agent refused because another agent process holds its node
ANOTHER_AGENT_EXIT = 3
#: seconds a tick in flight may still take after a stop (the whole stop has STOP_DEADLINE)
FINISH_GRACE = 1.5


class AgentLifecycle:
    """The running half of :class:`~gpupool_hub.agent.app.GPUPoolAgent` (the other: its settings and its tick)."""


    async def run(self: GPUPoolAgent) -> None:
        """Tick until :meth:`stop`; a tick's duration is not added to the interval. While the
        node holds shares the memory guard looks again between ticks (``memory_interval``).

        A stop waits at most ``FINISH_GRACE`` seconds for the tick in flight, then abandons
        its service calls (each report is sent again whole next time; a process already
        signalled stays signalled), so the agent is gone within 5 s of SIGTERM."""
        self._stopping = asyncio.Event()
        while not self._stopping.is_set():
            started = time.monotonic()
            await self._unless_stopped(self.tick())
            while not self._stopping.is_set():
                left = self.interval - (time.monotonic() - started)
                step = min(left, self.memory_interval) if self.guarding() else left
                try:
                    await asyncio.wait_for(self._stopping.wait(), max(0.0, step))
                except asyncio.TimeoutError:
                    pass
                if step >= left:
                    break
                await self._unless_stopped(self.guard_tick())
        await self._release()
        self._close_nvml()

    async def _unless_stopped(self: GPUPoolAgent, step: Any) -> None:
        """Run ``step`` (a coroutine) to its end; after a stop, give it ``FINISH_GRACE`` seconds
        (a stop it made is then reported, and audited) before cancelling it."""
        assert self._stopping is not None
        task = asyncio.ensure_future(step)
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=FINISH_GRACE)
        for pending in (task, stopping):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, stopping, return_exceptions=True)

    async def _release(self: GPUPoolAgent) -> None:
        """Give the node's lease up at the service (best effort: it lapses after agent_timeout anyway)."""
        if self.client is None or self.exit_status == ANOTHER_AGENT_EXIT:
            return
        try:
            await self.client.release(timeout=min(FINISH_GRACE, self.request_timeout))
        except Exception as e:  # best effort: the lease lapses after agent_timeout anyway
            self.log.info("Could not give node %s up at the service: %s", self.node_name, e)

    def stop(self: GPUPoolAgent) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def start(self: GPUPoolAgent) -> None:
        if self.once:
            result = asyncio.run(self.tick())
            self._close_nvml()
            print(json.dumps(result.as_dict(), indent=2, default=str))
            if not result.nvml_ok:
                raise SystemExit(1)
            return
        server = open_endpoint(self.metrics.registry, self.metrics_port, self.metrics_address, self.metrics_token_file)
        self.log.info("gpupool-agent %s on node %s: metrics on http://%s:%d/metrics%s, service %s%s", __version__,
                      self.node_name, self.metrics_address, server.server_port, self.metrics_token_file and " (token)",
                      self.service_url or "(none: metrics only)", ", DRY RUN" if self.dry_run else "")

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop_signal, sig)
            await self.run()

        asyncio.run(main())
        server.shutdown()
        if self.exit_status:
            raise SystemExit(self.exit_status)

    def _stop_signal(self: GPUPoolAgent, sig: int) -> None:
        """SIGTERM/SIGINT: stop now, and exit hard should anything hang past STOP_DEADLINE."""
        self.log.info("%s: stopping", signal.Signals(sig).name)
        exit_hard_later(signal.Signals(sig).name, "gpupool-agent")
        self.stop()
