"""The agent's steps for shared GPUs: the memory guard and the MPS caps.

A collaborator the agent builds and holds (``agent.share_steps``); its settings
stay the agent's (``c.GPUPoolAgent.memory_*``, ``mps*``) and are passed in. Each
tick ``GET nodes/{node}/memory`` names the shares of this node's GPUs and their
class:

* ``mps``: the GPU's MPS control daemon caps the share's memory and compute
  (:mod:`.mps`); the memory guard still watches it, for what MPS cannot see;
* ``timeslice``: nothing isolates memory, so the guard keeps the share to it
  (:mod:`.memguard`): a user over the limit is warned (a notice in ``GET me``
  and the lab widget) and, ``memory_grace`` seconds after the service accepted
  the warning, their biggest processes there stop. While the node holds shares
  the guard looks every ``memory_interval`` seconds, not once a tick, so by
  default an overrun is stopped within 20 s: at most ``memory_interval`` to see
  it, ``memory_grace`` of notice, ``memory_interval`` to act.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from .attribution import Snapshot
from .client import ServiceClient
from .errors import AgentServiceError
from .memguard import MemoryGuard, Share, iso_ts
from .metrics import AgentMetrics
from .mps import MpsControl, plan
from .results import TickResult


class ShareSteps:
    """The memory guard's and the MPS caps' steps, and what they remember between ticks."""

    def __init__(self, client: ServiceClient | None, metrics: AgentMetrics, memguard: MemoryGuard,
                 sample: Callable[[], Snapshot], *, log: logging.Logger, enabled: bool = True, mps: bool = True,
                 mps_control: str = "nvidia-cuda-mps-control", mps_root: str = "/run/gpupool-mps",
                 dry_run: bool = False) -> None:
        self.client, self.metrics, self.memguard, self.log = client, metrics, memguard, log
        self.sample = sample  # a fresh snapshot (blocking: runs in a thread)
        self.enabled, self.mps, self.dry_run = enabled, mps, dry_run
        self.mps_daemons = MpsControl(mps_control, mps_root)
        self.shares: list[Share] = []  # the last shares the service named
        self._memory_reported = False  # the last accepted report had warnings: an empty one must follow
        self._memory_unreported: list[dict[str, Any]] = []  # stops the service has not recorded yet

    async def _keep_mps(self, result: TickResult) -> None:
        caps = plan(result.snapshot, self.shares)  # type: ignore[arg-type]
        if caps or self.mps_daemons.applied:
            result.mps_failed = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.mps_daemons.keep(caps))
            for _ in result.mps_failed:
                self.metrics.loop_errors.labels("mps").inc()

    async def guard_memory(self, result: TickResult) -> None:
        """Warn, report, and stop what is due; nothing is stopped unless the warning reached the service."""
        snapshot = result.snapshot
        assert snapshot is not None and self.client is not None
        client, metrics = self.client, self.metrics
        try:
            self.shares, dry = await client.memory_shares()
            if self.mps:
                await self._keep_mps(result)
            now = time.time()
            result.memory_warnings = self.memguard.observe(snapshot, self.shares, now)
            done = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.memguard.enforce(snapshot, now, dry_run=dry))
            result.memory_actions = [a for _w, a in done]
            self._memory_unreported += [
                {"user": a.user, "server": ",".join(w.usage.servers), "gpu_uuid": w.usage.gpu_uuid, "pid": a.pid,
                 "memory_bytes": next((p.memory_bytes for p in w.usage.processes if p.pid == a.pid), 0),
                 "action": a.action, "detail": a.detail} for w, a in done]
            if result.memory_warnings or self._memory_unreported or self._memory_reported:
                grace = self.memguard.grace
                await client.report_memory({
                    "dry_run": dry or self.dry_run,
                    "warnings": [w.as_dict() | ({} if w.deadline else {"deadline": iso_ts(now + grace)})
                                 for w in result.memory_warnings],
                    "actions": self._memory_unreported[:1000],
                })
                self.memguard.accepted(now)
                del self._memory_unreported[:1000]
                self._memory_reported = bool(result.memory_warnings)
        except AgentServiceError as e:
            self.log.warning("Memory guard: service unavailable, stopping nothing this tick: %s", e)
            metrics.loop_errors.labels("memory").inc()
        except Exception:
            self.log.exception("Memory guard failed")
            metrics.loop_errors.labels("memory").inc()
        for a in result.memory_actions:
            metrics.enforcement_actions.labels(a.user, a.action).inc()

    async def guard_tick(self) -> TickResult:
        """A look between full ticks: a fresh snapshot, then only the memory guard (and MPS caps)."""
        result = TickResult()
        try:
            result.snapshot = await asyncio.get_running_loop().run_in_executor(None, self.sample)
            result.nvml_ok = result.service_ok = True
        except Exception as e:  # the full tick logs and counts NVML failures
            result.nvml_error = f"{type(e).__name__}: {e}"
            return result
        await self.guard_memory(result)
        return result

    def guarding(self) -> bool:
        """Whether the guard looks between ticks: it runs, and the node held shares at the last look."""
        return bool(self.enabled and self.client is not None and self.shares)
