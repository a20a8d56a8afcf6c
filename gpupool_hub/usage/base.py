"""What a usage source promises the debit job.

The debit job charges money-like tokens, so the contract is deliberately
narrow: a source either answers with exact, final GPU-seconds for a closed
interval, or raises :class:`UsageUnavailable` and nothing is charged. There is
no "best effort" answer; a partial answer would be charged and never corrected.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol, runtime_checkable

__all__ = ["Usage", "UsageSource", "UsageUnavailable"]


@dataclass(frozen=True)
class Usage:
    """GPU time one user spent on one GPU model during one interval.

    ``gpu_seconds`` is a :class:`~decimal.Decimal` so that fractional GPUs
    (0.25 GPU for an hour is 900) and long sums never pick up float rounding
    that would make two debit runs of the same interval disagree.
    """

    user: str
    model: str
    gpu_seconds: Decimal


class UsageUnavailable(Exception):
    """The source cannot answer for this interval yet (unreachable, garbage answer, data not complete). Nothing must be charged; the job retries later."""


@runtime_checkable
class UsageSource(Protocol):
    """Anything that can say who used which GPUs during ``[start, end)``."""

    name: str

    def usage(self, start: datetime, end: datetime) -> list[Usage]:
        """Usage in ``[start, end)`` (tz-aware UTC); raises :class:`UsageUnavailable`."""
        ...
