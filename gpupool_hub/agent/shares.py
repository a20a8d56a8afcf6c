"""The agent's steps for shared GPUs: the memory guard and the MPS caps.

A half of :class:`~gpupool_hub.agent.app.GPUPoolAgent` (its settings are
``c.GPUPoolAgent.…``). Each tick ``GET nodes/{node}/memory`` names the shares
of this node's GPUs and their class:

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
import time
from typing import TYPE_CHECKING, Any

from traitlets import Bool, Float, TraitError, Unicode, validate
from traitlets.config import Configurable

from .attribution import Snapshot, take_snapshot
from .errors import ServiceError
from .memguard import Share, iso_ts
from .mps import MpsControl, plan
from .nvml import list_gpus

if TYPE_CHECKING:
    from .app import TickResult


class ShareSteps(Configurable):
    """Settings and steps of the memory guard and the MPS caps."""

    memory_guard = Bool(
        True, help="Keep GPU shares to their memory: warn users over their share's limit, "
                   "then stop their biggest processes on that GPU (needs a service).",
    ).tag(config=True)
    memory_tolerance = Float(
        0.10, help="How far over its share a fraction may go: the limit is fraction x GPU memory x "
                   "(1 + memory_tolerance); 0.10 lets a 0.5 share of an 80 GB GPU hold 44 GB.",
    ).tag(config=True)
    memory_grace = Float(
        10.0, help="Seconds between the memory warning reaching the service (and the user's widget) and "
                   "the first process being stopped. With memory_interval, how long a neighbour's memory may "
                   "be taken: about memory_grace + 2 x memory_interval (16 s by default).",
    ).tag(config=True)
    memory_interval = Float(
        3.0, help="Seconds between the memory guard's looks while this node holds GPU shares (the full "
                  "tick, interval, may be longer).",
    ).tag(config=True)

    @validate("memory_tolerance", "memory_grace", "memory_interval")
    def _check_not_negative(self, proposal: Any) -> float:
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name} must not be negative")
        return proposal["value"]

    mps = Bool(
        True, help="Cap 'mps' shares through one NVIDIA MPS control daemon per GPU (started by the agent, "
                   "which must run as root). Off: mps shares are kept by the memory guard only.",
    ).tag(config=True)
    mps_control = Unicode(
        "nvidia-cuda-mps-control", help="The MPS control binary (a path, or a name looked up on PATH).",
    ).tag(config=True)
    mps_root = Unicode(
        "/run/gpupool-mps", help="Where each GPU's MPS pipe directory is (<mps_root>/<GPU UUID>/pipe); the "
                                 "same as c.GPUPoolSpawner.mps_root, which points servers there.",
    ).tag(config=True)

    def setup_shares(self) -> None:
        self.mps_daemons = MpsControl(self.mps_control, self.mps_root)
        self.shares: list[Share] = []  # the last shares the service named
        self._memory_reported = False  # the last accepted report had warnings: an empty one must follow
        self._memory_unreported: list[dict[str, Any]] = []  # stops the service has not recorded yet

    async def _keep_mps(self, result: TickResult) -> None:
        caps = plan(result.snapshot, self.shares)  # type: ignore[arg-type]
        if caps or self.mps_daemons.applied:
            result.mps_failed = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.mps_daemons.keep(caps))
            for _ in result.mps_failed:
                self.metrics.loop_errors.labels("mps").inc()  # type: ignore[attr-defined]

    async def _guard_memory(self, result: TickResult) -> None:
        """Warn, report, and stop what is due; nothing is stopped unless the warning reached the service."""
        snapshot = result.snapshot
        assert snapshot is not None and self.client is not None  # type: ignore[attr-defined]
        client, metrics = self.client, self.metrics  # type: ignore[attr-defined]
        try:
            self.shares, dry = await client.memory_shares()
            if self.mps:
                await self._keep_mps(result)
            now = time.time()
            result.memory_warnings = self.memguard.observe(snapshot, self.shares, now)  # type: ignore[attr-defined]
            done = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.memguard.enforce(snapshot, now, dry_run=dry))  # type: ignore[attr-defined]
            result.memory_actions = [a for _w, a in done]
            self._memory_unreported += [
                {"user": a.user, "server": ",".join(w.usage.servers), "gpu_uuid": w.usage.gpu_uuid, "pid": a.pid,
                 "memory_bytes": next((p.memory_bytes for p in w.usage.processes if p.pid == a.pid), 0),
                 "action": a.action, "detail": a.detail} for w, a in done]
            if result.memory_warnings or self._memory_unreported or self._memory_reported:
                grace = self.memguard.grace  # type: ignore[attr-defined]
                await client.report_memory({
                    "dry_run": dry or self.dry_run,  # type: ignore[attr-defined]
                    "warnings": [w.as_dict() | ({} if w.deadline else {"deadline": iso_ts(now + grace)})
                                 for w in result.memory_warnings],
                    "actions": self._memory_unreported[:1000],
                })
                self.memguard.accepted(now)  # type: ignore[attr-defined]
                del self._memory_unreported[:1000]
                self._memory_reported = bool(result.memory_warnings)
        except ServiceError as e:
            self.log.warning("Memory guard: service unavailable, stopping nothing this tick: %s", e)
            metrics.loop_errors.labels("memory").inc()
        except Exception:
            self.log.exception("Memory guard failed")
            metrics.loop_errors.labels("memory").inc()
        for a in result.memory_actions:
            metrics.enforcement_actions.labels(a.user, a.action).inc()

    async def guard_tick(self) -> TickResult:
        """A look between full ticks: a fresh snapshot, then only the memory guard (and MPS caps)."""
        from .app import TickResult  # the half knows the whole only at run time

        result = TickResult()
        try:
            result.snapshot = await asyncio.get_running_loop().run_in_executor(None, self._guard_sample)
            result.nvml_ok = result.service_ok = True
        except Exception as e:  # the full tick logs and counts NVML failures
            result.nvml_error = f"{type(e).__name__}: {e}"
            return result
        await self._guard_memory(result)
        return result

    def _guard_sample(self) -> Snapshot:
        """Memory and processes now; the per-process utilization windows stay the full tick's."""
        self._open_nvml()  # type: ignore[attr-defined]
        gpus = list_gpus(self.nvml)  # type: ignore[attr-defined]
        return take_snapshot(self.nvml, gpus, dict(self._samples_seen))  # type: ignore[attr-defined]

    def guarding(self) -> bool:
        """Whether the guard looks between ticks: it runs, and the node held shares at the last look."""
        return bool(self.memory_guard and self.client is not None and self.shares)  # type: ignore[attr-defined]
