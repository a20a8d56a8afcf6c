"""Why the pool says no, and what the audit log records: one vocabulary for the
service, the spawner and the CLI.

A refusal travels as its ``value`` string in the API (``{"reason": "no_capacity"}``);
the spawner turns it into an HTTP status and a title a person reads, and retries
only the reasons marked ``retryable``. A new reason is one line here.
"""

from __future__ import annotations

from enum import Enum


class RefusalReason(str, Enum):
    """A refusal of the pool, with how the spawner should present and treat it."""

    def __new__(cls, value: str, status: int, title: str, retryable: bool) -> "RefusalReason":
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.status = status  # type: ignore[attr-defined]
        obj.title = title  # type: ignore[attr-defined]
        obj.retryable = retryable  # type: ignore[attr-defined]
        return obj

    status: int
    title: str
    retryable: bool

    INSUFFICIENT_BALANCE = ("insufficient_balance", 403, "Not enough tokens", False)
    NO_CAPACITY = ("no_capacity", 503, "No GPU capacity", False)
    MODEL_UNAVAILABLE = ("model_unavailable", 400, "GPU model unavailable", False)
    RECLAIMING = ("reclaiming", 503, "Waiting for borrowed GPUs to be reclaimed", True)
    QUEUED = ("queued", 503, "Waiting for a GPU", True)
    QUEUE_LIMIT = ("queue_limit", 429, "Too many servers waiting", False)  # c.GPUPool.max_waiting_per_user

    @classmethod
    def parse(cls, value: object) -> "RefusalReason | None":
        """The reason named by an API answer, or None for one this version does not know."""
        try:
            return cls(str(value))
        except ValueError:
            return None

    def __str__(self) -> str:
        return self.value


class AuditAction(str, Enum):
    """What the audit log records: cull decisions, their failures and preemptions."""

    WARN = "warn"
    CLEAR_WARNING = "clear_warning"
    CULL_KERNELS = "cull_kernels"
    STOP_SERVER = "stop_server"
    FAILED = "failed"
    PREEMPT = "preempt"
    IDLE_WARN = "idle_warn"
    IDLE_RECLAIM = "idle_reclaim"
    MEMORY_WARN = "memory_warn"
    MEMORY_STOP = "memory_stop"
    NOTICE_DISMISSED = "notice_dismissed"  # a user dismissed the notice of an earlier event (detail: notice id)
    GPU_OUT_OF_BOUNDS = "gpu_out_of_bounds"  # a node agent found GPU processes of a user holding no allocation there
    GPU_OUT_OF_BOUNDS_STOP = "gpu_out_of_bounds_stop"  # ... and stopped (or was refused stopping) one after the grace
    GRANT = "grant"  # an admin granted tokens or took them back (written with the ledger entry)

    def __str__(self) -> str:
        return self.value
