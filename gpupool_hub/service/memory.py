"""Memory warnings of time-shared GPU fractions: what the node agents' memory guard
(``agent/memguard.py``) reports, kept for ``GET me``; the endpoints are in ``memory_api.py``.

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
from typing import Any

from ..ledger import AllocationRecord

# a node that stopped reporting (agent down) no longer warns anybody
STALE_SECONDS = 300.0


def shares_on(records: list[AllocationRecord], node: str) -> list[dict[str, Any]]:
    """The fractions of time-shared GPUs held on ``node``: what its memory guard watches."""
    return [{"gpu_uuid": g["uuid"], "user": r.user, "server": r.server, "milli": int(g["milli"])}
            for r in records if r.node == node for g in r.gpus
            if 0 < int(g["milli"]) < 1000 and not g.get("mig_uuid")]


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
