"""The ledger's values: what its stores take and answer. Plain frozen dataclasses (and the
two errors a caller of the book catches); no database here.

Amounts are ``Decimal`` tokens outside the database (integer milli-tokens inside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from ..money.credits import CREDIT_ENTRY_KINDS
from ..money.units import to_milli

KINDS = (*CREDIT_ENTRY_KINDS, "debit", "adjustment", "refund")
#: Kinds whose amount must be positive (credits) or negative (charges).
_POSITIVE = {*CREDIT_ENTRY_KINDS, "refund"}
_NEGATIVE = {"debit"}


class IdempotencyConflict(ValueError):
    """The key was already used for a different entry: a bug or a replayed request with other content."""


class UnknownAccount(LookupError):
    pass


@dataclass(frozen=True)
class Posting:
    """An entry to record. ``amount`` is signed: debits are negative."""

    account: str
    kind: str
    amount: Decimal
    key: str
    reason: str = ""
    actor: str = "system"
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    model: str | None = None
    gpu_seconds: Decimal | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown entry kind {self.kind!r}; expected one of {KINDS}")
        if self.kind in _POSITIVE and self.amount <= 0:
            raise ValueError(f"a {self.kind} must be positive, got {self.amount}")
        if self.kind in _NEGATIVE and self.amount > 0:
            raise ValueError(f"a {self.kind} must not be positive, got {self.amount}")
        if not self.key:
            raise ValueError("an entry needs an idempotency key")
        to_milli(self.amount)  # refuse sub-milli amounts early


@dataclass(frozen=True)
class Entry:
    id: int
    account: str
    kind: str
    amount: Decimal
    key: str
    reason: str
    actor: str
    created_at: datetime
    interval_start: datetime | None
    interval_end: datetime | None
    model: str | None
    gpu_seconds: Decimal | None


@dataclass(frozen=True)
class Posted:
    """The outcome of one posting: the recorded entry (the first one, on a replay)."""

    entry: Entry
    created: bool


@dataclass(frozen=True)
class Credited:
    """What ``Ledger.post_credits`` did: the postings' outcomes, and the balance they left (read in
    the same transaction, so the spawn that asked needs no second read)."""

    posted: list[Posted]
    balance: Decimal


@dataclass(frozen=True)
class Account:
    name: str
    balance: Decimal
    created_at: datetime
    credits_through: date | None


@dataclass(frozen=True)
class AllocationRecord:
    """A server's hold on GPUs; ``released_at`` is None while it is held."""

    id: str
    user: str
    server: str
    node: str
    gpus: tuple[dict, ...]  # type: ignore[type-arg]
    request: dict  # type: ignore[type-arg]
    price_per_hour: Decimal
    borrowed: bool
    created_at: datetime
    released_at: datetime | None = None
    release_reason: str | None = None
    #: when the charge starts (``created_at`` unless the server's work started later); None: it has not
    #: started (a batch job pending in its scheduler), so nothing is charged
    charged_from: datetime | None = None
    #: the hub stopped the server and the engine has not yet confirmed that its work ended (held, charged)
    stop_asked_at: datetime | None = None

    def charged_span(self, start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
        """The part of [start, end) this allocation is charged for: from ``charged_from`` until it was
        released; None if none (not started, or outside)."""
        if self.charged_from is None:
            return None
        low, high = max(start, self.charged_from), min(end, self.released_at or end)
        return (low, high) if high > low else None


@dataclass(frozen=True)
class AuditEvent:
    at: datetime
    user: str
    server: str
    action: str  # "warn" | "clear_warning" | "cull_kernels" | "stop_server" | "failed" | "grant" | …
    reason: str
    dry_run: bool = False
    detail: dict | None = None  # type: ignore[type-arg]
    id: int | None = None


@dataclass(frozen=True)
class Mismatch:
    account: str
    stored: Decimal
    computed: Decimal


@dataclass(frozen=True)
class VerifyReport:
    accounts: int
    entries: int
    mismatches: tuple[Mismatch, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches


@dataclass(frozen=True)
class GpuUse:
    """One user's GPU time on one day (thousandths of GPU-seconds). ``held`` includes the
    busy and the unknown parts; idle is what is left."""

    day: date
    user: str
    team: str
    held_milli: int
    busy_milli: int
    unknown_milli: int

    @property
    def idle_milli(self) -> int:
        return self.held_milli - self.busy_milli - self.unknown_milli


@dataclass(frozen=True)
class DayTotal:
    """Sums of a user's entries that fall on one day (by when they were posted) and,
    for debits, were used on one day (by the start of the charged interval)."""

    day: int  # index of the day the entries were posted on: 0 = the first day shown
    used_day: int  # debits: index of the day the GPU time was used (earlier usage counts as day 0)
    kind: str
    model: str | None
    credit_milli: int  # sum of the positive amounts
    debit_milli: int  # sum of the negative amounts


@dataclass(frozen=True)
class Window:
    """A user's balance now and the daily sums of their entries since the first day."""

    balance_milli: int
    totals: list[DayTotal]
    opened_at: datetime | None = None  # when the account was opened


@dataclass(frozen=True)
class AccountRow:
    name: str
    balance_milli: int
    created_at: datetime
