"""The values one agent tick passes around: what the service asks enforced, what the tick did.

Shared by the agent (:mod:`.app`), its client (:mod:`.client`) and its share steps
(:mod:`.shares`); it imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .attribution import Snapshot
from .boundary import BoundaryWarning
from .enforce import Action
from .memguard import MemoryWarning


@dataclass
class EnforceList:
    users: frozenset[str]
    kernels: frozenset[str] = frozenset()
    dry_run: bool = False
    # per user whose GPU access was revoked: the GPU UUIDs they still hold
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # the service holds no inventory of this node (it restarted): report it now
    report_inventory: bool = False


@dataclass
class TickResult:
    """What one tick saw and did; returned for tests and for ``--once``."""

    nvml_ok: bool = False
    nvml_error: str | None = None
    inventory: dict[str, Any] | None = None
    inventory_reported: bool = False
    snapshot: Snapshot | None = None
    service_ok: bool | None = None  # None: no service configured
    service_error: str | None = None
    enforce: EnforceList | None = None
    actions: list[Action] = field(default_factory=list)
    memory_warnings: list[MemoryWarning] = field(default_factory=list)
    memory_actions: list[Action] = field(default_factory=list)
    mps_failed: list[str] = field(default_factory=list)  # GPUs whose MPS caps could not be set, and why
    boundary_warnings: list[BoundaryWarning] = field(default_factory=list)
    boundary_actions: list[Action] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "nvml_ok": self.nvml_ok, "nvml_error": self.nvml_error, "inventory": self.inventory,
            "inventory_reported": self.inventory_reported,
            "gpus": [vars(g) for g in snap.gpus] if snap else [],
            "processes": [p.as_dict() for p in snap.processes] if snap else [],
            "service_ok": self.service_ok, "service_error": self.service_error,
            "enforce": None if self.enforce is None else {
                "users": sorted(self.enforce.users), "kernels": sorted(self.enforce.kernels),
                "dry_run": self.enforce.dry_run},
            "actions": [vars(a) | {"gpu_uuids": list(a.gpu_uuids)} for a in self.actions],
            "memory_warnings": [w.as_dict() for w in self.memory_warnings],
            "memory_actions": [vars(a) | {"gpu_uuids": list(a.gpu_uuids)} for a in self.memory_actions],
            "mps_failed": self.mps_failed,
            "boundary_warnings": [w.as_dict() for w in self.boundary_warnings],
            "boundary_actions": [vars(a) | {"gpu_uuids": list(a.gpu_uuids)} for a in self.boundary_actions],
        }
