"""How the node agent runs and stops: its loop, its signals, its node's lease.

A stop (SIGTERM, SIGINT) waits at most FINISH_GRACE for the tick in flight, and a hard exit
follows ``STOP_DEADLINE`` seconds later should anything hang
(``gpupool_hub/lifetime.py``). On its way out the agent gives its node up at the
service (``service/core/agent_leases.py``), so a successor is served at once. The
metrics port (``scrape.py``) is the agent's: it opens it before the loop runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..lifetime import exit_hard_later
from .client import ServiceClient
from .shares import ShareSteps

#: the exit status of an agent refused because another agent process holds its node
ANOTHER_AGENT_EXIT = 3
#: seconds a tick in flight may still take after a stop (the whole stop has STOP_DEADLINE)
FINISH_GRACE = 1.5


class AgentLifecycle:
    """The agent's loop: ticks, the memory guard's looks between them, and the stop.

    Holds whether it is stopping and why (``exit_status``: non-zero when the agent stopped by itself)."""

    def __init__(self, tick: Callable[[], Awaitable[Any]], shares: ShareSteps, client: ServiceClient | None,
                 close_nvml: Callable[[], None], *, node_name: str, request_timeout: float,
                 log: logging.Logger) -> None:
        self.tick, self.shares, self.client, self.close_nvml = tick, shares, client, close_nvml
        self.node_name, self.request_timeout, self.log = node_name, request_timeout, log
        self.exit_status = 0
        self._stopping: asyncio.Event | None = None

    async def run(self, interval: float, memory_interval: float) -> None:
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
                left = interval - (time.monotonic() - started)
                step = min(left, memory_interval) if self.shares.guarding() else left
                try:
                    await asyncio.wait_for(self._stopping.wait(), max(0.0, step))
                except asyncio.TimeoutError:
                    pass
                if step >= left:
                    break
                await self._unless_stopped(self.shares.guard_tick())
        await self._release()
        self.close_nvml()

    async def _unless_stopped(self, step: Any) -> None:
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

    async def _release(self) -> None:
        """Give the node's lease up at the service (best effort: it lapses after agent_timeout anyway)."""
        if self.client is None or self.exit_status == ANOTHER_AGENT_EXIT:
            return
        try:
            await self.client.release(timeout=min(FINISH_GRACE, self.request_timeout))
        except Exception as e:  # best effort: the lease lapses after agent_timeout anyway
            self.log.info("Could not give node %s up at the service: %s", self.node_name, e)

    def stop(self, exit_status: int = 0) -> None:
        """Stop the loop; a non-zero ``exit_status`` says why the agent stopped by itself."""
        if exit_status:
            self.exit_status = exit_status
        if self._stopping is not None:
            self._stopping.set()

    def serve(self, interval: float, memory_interval: float) -> int:
        """Run the loop until SIGTERM/SIGINT or a stop; the exit status."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop_signal, sig)
            await self.run(interval, memory_interval)

        asyncio.run(main())
        return self.exit_status

    def _stop_signal(self, sig: int) -> None:
        """SIGTERM/SIGINT: stop now, and exit hard should anything hang past STOP_DEADLINE."""
        self.log.info("%s: stopping", signal.Signals(sig).name)
        exit_hard_later(signal.Signals(sig).name, "gpupool-agent")
        self.stop()
