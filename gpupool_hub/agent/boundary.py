"""GPU processes out of bounds: their owner holds no allocation on that GPU.

Environment variables only ask the GPU libraries to hide devices, and a device
cgroup exists only where the engine sets one (``gpupool-systemd``, Slurm with
``ConstrainDevices``, Kubernetes' device plugin). So, on every engine, the node
agent checks what really runs: each GPU process (NVML) whose owner (real uid)
holds no allocation on that GPU (a whole GPU, a share, or the MIG instance the
process runs on) is out of bounds, whatever started it, kernels of running
servers included. That covers a CPU-only server that set
``NVIDIA_VISIBLE_DEVICES=all``, a server whose GPUs the pool took back, and
work started beside the hub.

The rules follow the memory guard (:mod:`.memguard`), per (GPU, user):

1. out of bounds: a warning (GPU, pids, deadline) goes to the service, which
   audits it (``gpu_out_of_bounds``); the deadline runs from the moment the
   service *accepted* the warning;
2. still out of bounds at the deadline: the processes are stopped through
   :class:`~.enforce.Enforcer` (SIGTERM, SIGKILL after its grace); root, system
   accounts, the agent and reused pids are never signalled: such a refusal is
   audited once, not retried every tick (root's GPU processes, e.g. a display
   server, are warned about and left running: an admin decides);
3. back in bounds (the process ended, or its owner now holds the GPU): the
   warning is dropped.

:func:`out_of_bounds` is pure; :class:`BoundaryGuard` keeps the warnings between
ticks and does the stopping.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .attribution import GpuProcess, Snapshot
from .enforce import Action, Enforcer
from .memguard import iso_ts, stop_due

log = logging.getLogger("gpupool.agent.boundary")

__all__ = ["BoundaryGuard", "BoundaryWarning", "OutOfBounds", "out_of_bounds"]


@dataclass(frozen=True)
class OutOfBounds:
    """One user's processes on one GPU they hold nothing of."""

    gpu_uuid: str
    gpu_index: int
    user: str
    processes: tuple[GpuProcess, ...]


def out_of_bounds(snapshot: Snapshot, holders: Mapping[str, Collection[str]]) -> list[OutOfBounds]:
    """Processes whose owner is not among the holders of their GPU (pure).

    ``holders`` maps a GPU UUID, or a MIG instance's UUID, to the users holding
    it or a share of it. A process on a MIG instance is in bounds for whoever
    holds that instance or the whole GPU. Unattributed processes (pid not
    visible here) are left out: nobody could be told or stopped."""
    grouped: dict[tuple[str, str], list[GpuProcess]] = {}
    index: dict[str, int] = {}
    for p in snapshot.processes:
        if p.user is None:
            continue
        allowed = set(holders.get(p.gpu_uuid, ()))
        if p.mig_uuid:
            allowed |= set(holders.get(p.mig_uuid, ()))
        if p.user in allowed:
            continue
        grouped.setdefault((p.gpu_uuid, p.user), []).append(p)
        index[p.gpu_uuid] = p.gpu_index
    return [OutOfBounds(uuid, index[uuid], user, tuple(sorted(procs, key=lambda p: p.pid)))
            for (uuid, user), procs in sorted(grouped.items())]


@dataclass
class BoundaryWarning:
    """An out-of-bounds (GPU, user); ``deadline`` is set once the service accepted the warning."""

    found: OutOfBounds
    since: float
    deadline: float | None = None
    dry_acted: bool = False  # a dry run logs its "would stop" once per warning
    spared: set[int] = field(default_factory=set)  # refused (root, system, agent) or failed: tried once

    @property
    def user(self) -> str:
        return self.found.user

    def as_dict(self, deadline: float | None = None) -> dict[str, Any]:
        """The warning for the service; ``deadline``: when it will be, for one not accepted yet."""
        f = self.found
        when = self.deadline or deadline
        return {"user": f.user, "gpu_uuid": f.gpu_uuid, "gpu_index": f.gpu_index,
                "pids": sorted({p.pid for p in f.processes})[:1024], "deadline": iso_ts(when) if when else ""}


@dataclass
class BoundaryGuard:
    """Warnings kept between ticks, and the stopping once they are due."""

    enforcer: Enforcer
    grace: float = 60.0
    warnings: dict[tuple[str, str], BoundaryWarning] = field(default_factory=dict)

    def observe(self, snapshot: Snapshot, holders: Mapping[str, Collection[str]], now: float) -> list[BoundaryWarning]:
        """New warnings for processes out of bounds; those back in bounds are dropped."""
        current: dict[tuple[str, str], BoundaryWarning] = {}
        for found in out_of_bounds(snapshot, holders):
            key = (found.gpu_uuid, found.user)
            w = self.warnings.get(key)
            if w is None:
                log.warning("GPU %s: process(es) %s of %s, who holds no allocation on it", found.gpu_uuid,
                            ", ".join(str(p.pid) for p in found.processes), found.user)
                w = BoundaryWarning(found, since=now)
            else:
                w.found = found
            current[key] = w
        for key in set(self.warnings) - set(current):
            log.info("GPU %s: %s is back in bounds", key[0], key[1])
        self.warnings = current
        return list(current.values())

    def unreported(self) -> list[BoundaryWarning]:
        """Warnings the service has not accepted yet (only these are sent: each is audited once)."""
        return [w for w in self.warnings.values() if w.deadline is None]

    def accepted(self, warnings: Iterable[BoundaryWarning], now: float) -> None:
        """The service has these warnings: their graces run from now."""
        for w in warnings:
            if w.deadline is None:
                w.deadline = now + self.grace

    def enforce(self, snapshot: Snapshot, now: float, *, dry_run: bool = False) -> list[tuple[BoundaryWarning, Action]]:
        """Stop the processes of due warnings, kernels of running servers included."""
        def victims(w: BoundaryWarning) -> list[GpuProcess]:
            chosen = [p for p in w.found.processes if p.pid not in w.spared]
            if chosen:
                log.warning("GPU %s: %s still holds no allocation on it: stopping pid(s) %s", w.found.gpu_uuid,
                            w.user, ", ".join(str(p.pid) for p in chosen))
            return chosen

        return stop_due(self.enforcer, snapshot, self.warnings.values(), now, dry_run, victims)
