"""Memory warnings of time-shared GPU fractions: what the node agents' memory guard
(``agent/memguard.py``) reports, kept for ``GET me``, and the audit events of its reports and of the boundary
guard's (``agent/boundary.py``); the endpoints are in ``api/nodes.py``.

``GET nodes/{node}/memory`` tells a node's agent which users hold which share of
which time-shared GPU there (whole GPUs and MIG instances are not guarded).
``PUT nodes/{node}/memory`` carries the node's current warnings (each report
replaces the node's previous ones, so a warning disappears when the user is back
under the limit) and what the agent stopped. The service only relays and
records: the agent measures and decides, and counts the grace from the moment
this service accepted the warning, so the user sees it before anything stops.

A dry run (the service's ``agent_dry_run`` or the agent's own) keeps its warnings
apart, so users never see a threat that will not be carried out; the audit log
has them, marked as dry runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ...ledger import AllocationRecord, AuditEvent
from ...reasons import AuditAction

# a node that stopped reporting (agent down) no longer warns anybody
STALE_SECONDS = 300.0


def shares_on(records: list[AllocationRecord], node: str) -> list[dict[str, Any]]:
    """The fractions of shared GPUs held on ``node``, with their class (``timeslice``: the memory
    guard keeps them; ``mps``: the agent sets their caps through the GPU's MPS control daemon)."""
    return [{"gpu_uuid": g["uuid"], "user": r.user, "server": r.server, "milli": int(g["milli"]),
             "class": g.get("share") or "timeslice"}
            for r in records if r.node == node for g in r.gpus
            if 0 < int(g["milli"]) < 1000 and not g.get("mig_uuid")]


def holders_on(records: list[AllocationRecord], node: str) -> dict[str, list[str]]:
    """GPU UUID (and MIG instance UUID) -> the users holding it or a share of it on ``node``:
    what the boundary guard checks each process against."""
    out: dict[str, set[str]] = {}
    for r in records:
        if r.node != node:
            continue
        for g in r.gpus:
            out.setdefault(g.get("mig_uuid") or g["uuid"], set()).add(r.user)
    return {uuid: sorted(users) for uuid, users in sorted(out.items())}


def memory_events(node: str, new: list[dict[str, Any]], actions: list[dict[str, Any]], dry: bool,
                  now: datetime) -> list[AuditEvent]:
    """The audit log's lines for a memory report: each new warning, each process stopped."""
    events = [AuditEvent(now, w["user"], w["server"], AuditAction.MEMORY_WARN.value,
                         f"uses {w['used_bytes'] >> 20} MiB of GPU {w['gpu_uuid']} on {node}, over the "
                         f"{w['limit_bytes'] >> 20} MiB limit of a {w['fraction_milli'] / 1000:.3f} share; "
                         f"processes stop from {w['deadline']}", dry,
                         {"node": node, **{k: w[k] for k in ("gpu_uuid", "limit_bytes", "used_bytes",
                                                              "deadline", "pids")}})
              for w in new]
    events += [AuditEvent(now, a["user"], a["server"], AuditAction.MEMORY_STOP.value,
                          f"pid {a['pid']} ({a['memory_bytes'] >> 20} MiB on GPU {a['gpu_uuid']}): {a['action']}"
                          + (f" ({a['detail']})" if a["detail"] else ""), dry,
                          {"node": node, **a})
               for a in actions]
    return events


def boundary_events(node: str, warnings: list[dict[str, Any]], actions: list[dict[str, Any]], dry: bool,
                    now: datetime) -> list[AuditEvent]:
    """The audit log's lines for a boundary report: each warning (the agent sends it once), each stop."""
    events = [AuditEvent(now, w["user"], "", AuditAction.GPU_OUT_OF_BOUNDS.value,
                         f"process(es) {', '.join(map(str, w['pids']))} on GPU {w['gpu_uuid']} of {node}, "
                         f"which {w['user']} holds no allocation on; stopped from {w['deadline']}", dry,
                         {"node": node, **w})
              for w in warnings]
    events += [AuditEvent(now, a["user"], "", AuditAction.GPU_OUT_OF_BOUNDS_STOP.value,
                          f"pid {a['pid']} on GPU {a['gpu_uuid']} of {node}: {a['action']}"
                          + (f" ({a['detail']})" if a["detail"] else ""), dry, {"node": node, **a})
               for a in actions]
    return events


@dataclass
class MemoryWarnings:
    """Per node, the warnings of its last report (user-visible, and dry-run ones apart)."""

    reports: dict[str, tuple[float, list[dict[str, Any]], bool]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, node: str, warnings: list[dict[str, Any]], dry_run: bool) -> list[dict[str, Any]]:
        """Replace ``node``'s warnings; returns the ones that are new (for the audit log)."""
        with self._lock:
            _at, before, _dry = self.reports.get(node, (0.0, [], dry_run))
            self.reports[node] = (time.monotonic(), warnings, dry_run)
        known = {(w["user"], w["gpu_uuid"]) for w in before}
        return [w for w in warnings if (w["user"], w["gpu_uuid"]) not in known]

    def for_user(self, user: str) -> list[dict[str, Any]]:
        """What ``GET me`` shows ``user``: their warnings from nodes that report, dry runs left out."""
        now = time.monotonic()
        with self._lock:
            reports = list(self.reports.values())
        return [{k: w[k] for k in ("server", "gpu_uuid", "gpu_index", "fraction_milli", "limit_bytes",
                                   "used_bytes", "since", "deadline")}
                for at, warnings, dry in reports if not dry and now - at < STALE_SECONDS
                for w in warnings if w["user"] == user]
