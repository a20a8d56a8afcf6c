"""``IdleWarnings``: what users see of idleness, written by the idle job only
(rules in ``gpupool_hub/takeback/idle.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ...takeback.cull import CullWarning
from ...takeback.idle import GpuReading, ServerIdleness
from ...timefmt import iso


class IdleWarnings:
    """What users see of idleness: the idle warnings per (user, server), and the last
    readings of the held GPUs with each server's idleness; written by the idle job only
    (the readings are replaced whole, so a view never mixes two runs)."""

    def __init__(self) -> None:
        self.warnings: dict[tuple[str, str], CullWarning] = {}
        self.dry: dict[tuple[str, str], CullWarning] = {}
        self.allocations: dict[tuple[str, str], str] = {}
        # when measured; per (allocation id, GPU UUID) what the server's own processes did; per allocation its idleness
        self.measured: tuple[datetime | None, dict[tuple[str, str], GpuReading], dict[str, ServerIdleness]] = (
            None, {}, {})

    def warnings_for(self, dry_run: bool) -> dict[tuple[str, str], CullWarning]:
        """The idle warnings standing now (a dry run's apart), for the rules to read."""
        return self.dry if dry_run else self.warnings

    def warn(self, user: str, server: str, warning: CullWarning, allocation: str, *, dry_run: bool) -> None:
        """The idle job warned that ``user``'s ``server`` (holding ``allocation``) stops at the deadline."""
        self.warnings_for(dry_run)[(user, server)] = warning
        self.allocations[(user, server)] = allocation

    def clear(self, user: str, server: str, *, dry_run: bool) -> None:
        """The server's idle warning no longer stands: busy again, nobody waits, or stopped."""
        self.warnings_for(dry_run).pop((user, server), None)
        self.allocations.pop((user, server), None)

    def publish(self, at: datetime | None, readings: dict[tuple[str, str], GpuReading],
                servers: dict[str, ServerIdleness]) -> None:
        """The idle job's new readings (per allocation id and GPU UUID: the server's own
        figure) and idleness (per allocation id)."""
        self.measured = (at, readings, servers)

    def idle_since(self) -> dict[str, datetime]:
        """Allocation id -> since when the server is idle (the admins' pool view)."""
        return {a: s.idle_since for a, s in self.measured[2].items()}

    def own_utilization(self) -> dict[str, float]:
        """Allocation id -> the busiest of its GPUs as its own processes used them (the
        admins' pool view); left out where any of them is unknown."""
        per: dict[str, list[float | None]] = {}
        for (alloc, _uuid), r in self.measured[1].items():
            per.setdefault(alloc, []).append(r.utilization)
        return {a: max(v) for a, v in per.items() if v and all(x is not None for x in v)}  # type: ignore[type-var]

    def activity(self, user: str, allocations: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``GET me``'s ``gpu_servers``: the user's held GPUs as measured, and each
        server's idleness, from the allocations of the user's (cached) view."""
        at, readings, servers = self.measured
        out = []
        for a in allocations:
            gpus = []
            for g in a["gpus"]:
                r = readings.get((a["id"], g["uuid"]))
                gpus.append({"uuid": g["uuid"], "index": g["index"], "model": g["model"],
                             "utilization": None if r is None or r.utilization is None else round(r.utilization, 4),
                             "memory_used_bytes": r.memory_used_bytes if r else None,
                             "memory_total_bytes": r.memory_total_bytes if r else None})
            idle = servers.get(a["id"])
            warning = self.warnings.get((user, a["server"]))
            out.append({"allocation": a["id"], "server": a["server"], "node": a["node"], "gpus": gpus,
                        "measured_at": iso(at) if readings else None,
                        "idle_since": iso(idle.idle_since) if idle else None,
                        "reclaimable_at": iso(idle.reclaimable_at) if idle else None,
                        "max_idle_at": iso(idle.max_idle_at) if idle and idle.max_idle_at else None,
                        "reclaim_deadline": iso(warning.deadline) if warning else None})
        return out

    def for_user(self, user: str) -> CullWarning | None:
        mine = [w for (u, _), w in list(self.warnings.items()) if u == user]
        return min(mine, key=lambda w: w.deadline) if mine else None

    def deadlines(self) -> dict[str, datetime]:
        """Allocation id -> idle stop deadline (wait estimates use them)."""
        return {self.allocations[k]: w.deadline for k, w in list(self.warnings.items()) if k in self.allocations}
