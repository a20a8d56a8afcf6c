"""Keeping time-shared GPU fractions to their memory.

Time-slicing gives a share of a GPU's compute but no memory isolation: one
notebook of a 0.5 share can fill the whole card and make its neighbour's
``cudaMalloc`` fail. So a share of ``f`` may hold about ``f`` of the GPU's
memory: the limit is ``f × total × (1 + tolerance)``. Whole GPUs are not
guarded (nobody shares them), nor MIG instances (the hardware isolates them).

The rules, per (GPU, user) with a share on a GPU of this node:

1. the user's memory on the GPU is the sum over their processes there (NVML);
   memory NVML leaves empty is unknown, not 0: those processes get the GPU's used
   memory minus what NVML attributes (split evenly between them), and the
   warning says the figure is estimated;
2. over the limit: a warning (limit, current use, deadline, what stops) goes to
   the service, which shows it in ``GET me`` and the lab widget; the deadline
   is counted from the moment the service *accepted* the warning, so nothing is
   stopped before the user could see why;
3. still over at the deadline: the user's processes on that GPU are stopped
   by pid, the biggest first, until what is left fits the limit; through
   :class:`~.enforce.Enforcer`, so root, system accounts, the agent and reused
   pids are never signalled, and a dry run only logs (once per warning);
4. back under the limit: the warning is cleared.

The decisions (:func:`measure`, :func:`pick_victims`) are pure; :class:`MemoryGuard`
keeps the warnings between ticks and does the stopping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from ..timefmt import iso
from .attribution import GpuProcess, Snapshot
from .enforce import FAILED, SKIPPED_CHANGED, Action, Enforcer

log = logging.getLogger("gpupool.agent.memguard")

MIB = 1 << 20


@dataclass(frozen=True)
class Share:
    """A fraction of a shared GPU held by a user's server (from the service)."""

    gpu_uuid: str
    user: str
    server: str
    milli: int  # 1..999
    share_class: str = "timeslice"  # or "mps": capped by the GPU's MPS daemon too (agent/mps.py)


@dataclass(frozen=True)
class MemoryUse:
    """One user's memory on one shared GPU, against the limit of their share(s)."""

    gpu_uuid: str
    gpu_index: int
    user: str
    servers: tuple[str, ...]
    milli: int
    limit_bytes: int
    used_bytes: int
    processes: tuple[GpuProcess, ...]
    estimated: bool = False  # some memory NVML left empty: used memory minus what it attributes

    @property
    def over(self) -> bool:
        return self.used_bytes > self.limit_bytes


@dataclass
class MemoryWarning:
    """A user over their share's memory on one GPU; ``deadline`` is set once the service accepted it."""

    usage: MemoryUse
    since: float
    deadline: float | None = None
    dry_acted: bool = False  # a dry run logs its "would stop" once per warning
    # pids the enforcer refused (root, system accounts, the agent) or failed to signal: tried once, not every tick
    spared: set[int] = field(default_factory=set)

    @property
    def user(self) -> str:
        return self.usage.user

    def as_dict(self) -> dict[str, Any]:
        u = self.usage
        return {
            "user": u.user, "server": ",".join(u.servers), "gpu_uuid": u.gpu_uuid, "gpu_index": u.gpu_index,
            "fraction_milli": u.milli, "limit_bytes": u.limit_bytes, "used_bytes": u.used_bytes,
            "since": iso_ts(self.since), "deadline": iso_ts(self.deadline) if self.deadline else None,
            "pids": sorted({p.pid for p in u.processes}),
        }


def iso_ts(ts: float) -> str:
    return iso(datetime.fromtimestamp(ts, timezone.utc)) or ""


def measure(snapshot: Snapshot, shares: Iterable[Share], tolerance: float) -> list[MemoryUse]:
    """Each share holder's memory on each shared GPU of the snapshot (pure).

    A user's several shares of one GPU add up; processes on a MIG instance are
    not counted (the hardware keeps those to their slice)."""
    held: dict[tuple[str, str], tuple[int, list[str]]] = {}
    for s in shares:
        milli, servers = held.get((s.gpu_uuid, s.user), (0, []))
        held[(s.gpu_uuid, s.user)] = (milli + s.milli, servers + [s.server])
    gpus = {g.uuid: g for g in snapshot.gpus}
    out = []
    for (uuid, user), (milli, servers) in sorted(held.items()):
        gpu = gpus.get(uuid)
        if gpu is None or milli >= 1000:
            continue
        procs = tuple(p for p in _with_unknown_memory(snapshot, gpu.uuid, gpu.memory_used_bytes)
                      if p.user == user and p.mig_uuid is None)
        limit = int(gpu.memory_total_bytes * milli * (1 + tolerance)) // 1000
        estimated = any(p.memory_bytes is None for p in snapshot.processes if p.gpu_uuid == uuid and p.user == user)
        out.append(MemoryUse(uuid, gpu.index, user, tuple(sorted(set(servers))), milli, limit,
                         sum(p.memory_bytes or 0 for p in procs), procs, estimated))
    return out


def _with_unknown_memory(snapshot: Snapshot, uuid: str, used: int | None) -> list[GpuProcess]:
    """The GPU's processes, those whose memory NVML left empty given an even part of
    what the GPU uses beyond the memory NVML attributes (pure)."""
    procs = [p for p in snapshot.processes if p.gpu_uuid == uuid]
    unknown = [p for p in procs if p.memory_bytes is None]
    if not unknown:
        return procs
    rest = max(0, (used or 0) - sum(p.memory_bytes or 0 for p in procs)) // len(unknown)
    return [replace(p, memory_bytes=rest) if p.memory_bytes is None else p for p in procs]


def pick_victims(usage: MemoryUse, spared: Iterable[int] = ()) -> list[GpuProcess]:
    """The fewest processes to stop, biggest first, for what is left to fit the limit (pure);
    ``spared`` pids are never picked (their memory stays counted)."""
    left, out, spared = usage.used_bytes, [], set(spared)
    for p in sorted(usage.processes, key=lambda p: (-(p.memory_bytes or 0), p.pid)):
        if left <= usage.limit_bytes:
            break
        if p.pid in spared:
            continue
        out.append(p)
        left -= p.memory_bytes or 0
    return out


@dataclass
class MemoryGuard:
    """Warnings kept between ticks, and the stopping once they are due."""

    enforcer: Enforcer
    tolerance: float = 0.10
    grace: float = 120.0
    warnings: dict[tuple[str, str], MemoryWarning] = field(default_factory=dict)

    def observe(self, snapshot: Snapshot, shares: Iterable[Share], now: float) -> list[MemoryWarning]:
        """Update the warnings from a snapshot: new ones for users over, cleared for users back under."""
        current: dict[tuple[str, str], MemoryWarning] = {}
        for u in measure(snapshot, shares, self.tolerance):
            if not u.over:
                continue
            key = (u.gpu_uuid, u.user)
            w = self.warnings.get(key)
            if w is None:
                log.warning("%s uses %d MiB on GPU %s, over the %d MiB limit of a %.3f share%s",
                            u.user, u.used_bytes // MIB, u.gpu_uuid, u.limit_bytes // MIB, u.milli / 1000,
                            " (estimated: NVML leaves some of the user's memory empty, so the GPU's used memory "
                            "minus what it attributes counts as theirs)" if u.estimated else "")
                w = MemoryWarning(u, since=now)
            else:
                w.usage = u
            current[key] = w
        for key in set(self.warnings) - set(current):
            log.info("%s is back under the memory limit on GPU %s", key[1], key[0])
        self.warnings = current
        return list(current.values())

    def accepted(self, now: float) -> None:
        """The service has the current warnings (users can see them): their graces run from now."""
        for w in self.warnings.values():
            if w.deadline is None:
                w.deadline = now + self.grace

    def enforce(self, snapshot: Snapshot, now: float, *, dry_run: bool = False) -> list[tuple[MemoryWarning, Action]]:
        """Stop, biggest first, the processes of users whose warning is due; returns what was done per warning."""
        def victims(w: MemoryWarning) -> list[GpuProcess]:
            u = w.usage
            chosen = pick_victims(u, w.spared)
            if chosen:
                log.warning("%s is still over the memory limit on GPU %s (%d of %d MiB): stopping pid(s) %s",
                            u.user, u.gpu_uuid, u.used_bytes // MIB, u.limit_bytes // MIB,
                            ", ".join(str(p.pid) for p in chosen))
            return chosen

        # kernels too: a kernel is what usually holds the memory; the server stays up
        return stop_due(self.enforcer, snapshot, self.warnings.values(), now, dry_run, victims)


W = TypeVar("W", bound="DueWarning")


class DueWarning(Protocol):
    """A warning whose processes are stopped once its deadline passed (memory, boundary)."""

    deadline: float | None
    dry_acted: bool
    spared: set[int]

    @property
    def user(self) -> str: ...


def stop_due(enforcer: Enforcer, snapshot: Snapshot, warnings: Iterable[W], now: float, dry_run: bool,
             victims: Callable[[W], list[GpuProcess]]) -> list[tuple[W, Action]]:
    """Stop ``victims(w)`` of each warning whose deadline passed, kernels included; a dry run acts
    (logs) once per warning, and pids the enforcer refused or failed on are not tried again."""
    out: list[tuple[W, Action]] = []
    for w in list(warnings):
        if w.deadline is None or now < w.deadline:
            continue
        dry = dry_run or enforcer.dry_run
        if dry and w.dry_acted:
            continue
        chosen = victims(w)
        if not chosen:
            continue
        actions = enforcer.enforce(Snapshot(snapshot.taken_at, snapshot.gpus, chosen), {w.user}, {w.user},
                                   dry_run=dry)
        w.dry_acted = w.dry_acted or dry
        w.spared.update(a.pid for a in actions
                        if (a.action.startswith("skipped_") and a.action != SKIPPED_CHANGED) or a.action == FAILED)
        out.extend((w, a) for a in actions)
    return out
