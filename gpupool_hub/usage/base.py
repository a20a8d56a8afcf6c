"""What a usage source promises the debit job.

The debit job charges money-like tokens, so the contract is deliberately
narrow: a source either answers with exact, final GPU-seconds for a closed
interval, or raises :class:`UsageUnavailable` and nothing is charged. There is
no "best effort" answer; a partial answer would be charged and never corrected.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Protocol, runtime_checkable

__all__ = ["Usage", "UsageConfigError", "UsageNotSettled", "UsageSource", "UsageUnavailable"]


@dataclass(frozen=True)
class Usage:
    """GPU time one user spent on one GPU model during one interval.

    ``gpu_seconds`` is a :class:`~decimal.Decimal` so that fractional GPUs
    (0.25 GPU for an hour is 900) and long sums never pick up float rounding
    that would make two debit runs of the same interval disagree.

    With ``mig_profile`` the time is of MIG instances of that profile on GPUs
    of ``model`` (instance-seconds, priced per instance-hour): an instance's
    share of its GPU (1/7) is not a finite decimal, so it is not folded into
    ``gpu_seconds``. Rows that differ only by ``share_class`` are charged as one
    debit of their ``charge_key``, each part at its class's price.
    """

    user: str
    model: str
    gpu_seconds: Decimal
    mig_profile: str | None = None
    #: a fraction's guarantee class ("mps", "timeslice"), priced by ``c.GPUPool.share_price_factors``;
    #: "" for whole GPUs and from sources that cannot tell (they charge every fraction at factor 1)
    share_class: str = ""

    @property
    def charge_key(self) -> str:
        """What the ledger charges and carries rounding remainders by: the model, or model + MIG profile."""
        return f"{self.model} MIG {self.mig_profile}" if self.mig_profile else self.model


class UsageUnavailable(Exception):
    """The source cannot answer for this interval yet (unreachable, garbage answer, data not complete). Nothing must be charged; the job retries later."""


class UsageNotSettled(UsageUnavailable):
    """The interval has closed but its data may still arrive (e.g. Prometheus's settle
    delay): nothing is wrong, the job charges it once ``settled_at`` has passed.
    Not a failure, so accounting is not reported as delayed for it."""

    def __init__(self, message: str, settled_at: datetime) -> None:
        super().__init__(message)
        self.settled_at = settled_at

    @classmethod
    def unless_settled(cls, end: datetime, now: datetime, settle_seconds: float, late_data: str) -> None:
        """Raise for an interval ending at ``end`` that is less than ``settle_seconds`` old at
        ``now``; ``late_data`` says what may still arrive ("samples may still arrive")."""
        settled_at = end + timedelta(seconds=settle_seconds)
        if now < settled_at:
            raise cls(f"interval ending {end.isoformat()} is not settled yet: {late_data} until "
                      f"{settled_at.isoformat()} (now {now.isoformat()}, settle {settle_seconds}s)", settled_at)


@runtime_checkable
class UsageSource(Protocol):
    """Anything that can say who used which GPUs during ``[start, end)``."""

    name: str

    def usage(self, start: datetime, end: datetime) -> list[Usage]:
        """Usage in ``[start, end)`` (tz-aware UTC); raises :class:`UsageUnavailable`."""
        ...


class UsageConfigError(ValueError):
    """A usage setting that cannot work; the message names the settings to change (the service
    stops at start with it)."""
