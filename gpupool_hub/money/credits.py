"""The token-bucket rules: what a user is granted, and when.

Pure functions with no I/O. Given when credits were last applied and the
current time, they name every credit that is due, each with an idempotency
key, so that a service that was down for 40 days hands out exactly 40 daily
credits (and the monthly ones in between) once, however often it retries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import date, datetime, time, timedelta, tzinfo
from decimal import Decimal

from .keys import entry_key
from .units import AmountError, parse_amount

_LESS_IS_GENEROUS = ("floor",)  # for every other field, more is more generous


@dataclass(frozen=True)
class CreditRules:
    """One user's grant schedule. Defaults are the original system's."""

    initial: Decimal = Decimal(100)
    monthly: Decimal = Decimal(30)
    daily: Decimal = Decimal(1)
    floor: Decimal = Decimal(-10)
    max_balance: Decimal | None = None

    def __post_init__(self) -> None:
        for name in ("initial", "monthly", "daily"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} credit must not be negative")
        if self.floor > 0:
            raise ValueError(f"floor must be zero or negative, got {self.floor}")
        if self.max_balance is not None and self.max_balance < 0:
            raise ValueError(f"max_balance must not be negative, got {self.max_balance}")

    @classmethod
    def from_config(cls, values: Mapping[str, object], *, where: str) -> CreditRules:
        """Build rules from admin config, naming the bad key in every error."""
        allowed = {f.name for f in fields(cls)}
        kwargs: dict[str, Decimal | None] = {}
        for key, value in values.items():
            if key not in allowed:
                raise ValueError(f"{where}: unknown key {key!r}; expected one of {sorted(allowed)}")
            if key == "max_balance" and value is None:
                kwargs[key] = None
                continue
            try:
                kwargs[key] = parse_amount(value, what=key)
            except AmountError as e:
                raise ValueError(f"{where}[{key!r}] = {value!r}: {e}") from None
        try:
            return cls(**kwargs)  # type: ignore[arg-type]
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def rules_for_groups(
    base: CreditRules, overrides: Mapping[str, Mapping[str, Decimal | None]], groups: Iterable[str]
) -> CreditRules:
    """Combine group overrides: each field takes the most generous value among the
    user's groups that set it (largest grant, credit and cap, lowest floor);
    fields no group sets keep the base value. Group order never matters.
    """
    chosen: dict[str, Decimal | None] = {}
    for group in sorted(set(groups)):
        override = overrides.get(group)
        if override is None:
            continue
        for key, value in override.items():
            if key not in chosen:
                chosen[key] = value  # type: ignore[assignment]
            elif key in _LESS_IS_GENEROUS:
                chosen[key] = min(chosen[key], value)  # type: ignore[type-var]
            elif key == "max_balance":
                chosen[key] = None if value is None or chosen[key] is None else max(chosen[key], value)  # type: ignore[type-var]
            else:
                chosen[key] = max(chosen[key], value)  # type: ignore[type-var]
    return replace(base, **chosen) if chosen else base


@dataclass(frozen=True)
class CreditKind:
    """One kind of scheduled credit, stated once. Its ``name`` is a ledger entry kind, the key of its
    amount in ``GET me``'s ``credits`` (``openapi.json``, the widget's ``ICredits``) and of its next time
    (``next_<name>_at``); the form, the usage page and a refusal say it in these words
    (``tests/test_credit_kinds.py`` compares them all)."""

    name: str
    every: str  # "every day": when it comes, as the form says it
    title: str  # "Daily credit": the usage page's row
    words: str  # "the daily credits": the credit a refusal says makes a start affordable

    @property
    def next_at(self) -> str:
        return f"next_{self.name}_at"


DAILY = CreditKind("daily", "every day", "Daily credit", "the daily credits")
MONTHLY = CreditKind("monthly", "on the 1st of each month", "Monthly credit", "the monthly credit")
#: the scheduled credits, in the order they are shown
SCHEDULED = (DAILY, MONTHLY)
#: the ledger's kinds of credit entries: the initial grant and the scheduled credits
CREDIT_ENTRY_KINDS = ("grant", *(k.name for k in SCHEDULED))


@dataclass(frozen=True)
class DueCredit:
    """A credit the ledger should post (once: ``key`` makes it idempotent)."""

    kind: str  # one of CREDIT_ENTRY_KINDS
    amount: Decimal
    key: str
    day: date
    reason: str


def local_day(now: datetime, tz: tzinfo) -> date:
    return now.astimezone(tz).date()


def due_credits(user: str, rules: CreditRules, last_day: date | None, now: datetime, tz: tzinfo) -> list[DueCredit]:
    """Every credit due to ``user`` after ``last_day`` up to and including today.

    ``last_day`` is the last local day whose credits were applied; ``None``
    means a new account, which gets the initial grant (and no daily credit for
    the day it was created). Monthly credits fall on the first of the month.
    """
    today = local_day(now, tz)
    due: list[DueCredit] = []
    if last_day is None:
        due.append(
            DueCredit("grant", rules.initial, entry_key("grant", user, "initial"), today, "initial grant")
        )
        return [c for c in due if c.amount > 0]
    day = last_day + timedelta(days=1)
    while day <= today:
        if day.day == 1 and rules.monthly > 0:
            due.append(
                DueCredit(MONTHLY.name, rules.monthly, entry_key(MONTHLY.name, user, day.strftime("%Y-%m")), day,
                          f"monthly credit for {day:%B %Y}")
            )
        if rules.daily > 0:
            due.append(DueCredit(DAILY.name, rules.daily, entry_key(DAILY.name, user, day), day, f"daily credit for {day}"))
        day += timedelta(days=1)
    return due


def capped(amount: Decimal, balance: Decimal, max_balance: Decimal | None) -> Decimal:
    """The part of a credit that fits under the cap (never negative: a cap never takes tokens away)."""
    if max_balance is None:
        return amount
    return max(Decimal(0), min(amount, max_balance - balance))


def next_credit_times(now: datetime, tz: tzinfo) -> tuple[datetime, datetime]:
    """When the next daily and the next monthly credit fall (local midnight), as aware datetimes, in the
    order of :data:`SCHEDULED`."""
    today = local_day(now, tz)
    tomorrow = today + timedelta(days=1)
    first = date(today.year + (today.month == 12), today.month % 12 + 1, 1)
    return (datetime.combine(tomorrow, time(), tz), datetime.combine(first, time(), tz))


def start_need(price_per_hour: Decimal, held_per_hour: Decimal = Decimal(0),
               min_hours: Decimal = Decimal(1)) -> Decimal:
    """Tokens above the floor a GPU server needs to start: what *all* the user's servers, the held
    ones and this one, cost for ``min_hours``. The one rule behind admission, its refusal and the
    spawn form's "needs … tokens", so that they never name two amounts for one start."""
    return (held_per_hour + price_per_hour) * min_hours


def can_start(balance: Decimal, price_per_hour: Decimal, rules: CreditRules, min_hours: Decimal = Decimal(1),
              held_per_hour: Decimal = Decimal(0)) -> bool:
    """A GPU server may start when its :func:`start_need` keeps the balance at or above the floor."""
    return balance - start_need(price_per_hour, held_per_hour, min_hours) >= rules.floor


def hours_bought(balance: Decimal, floor: Decimal, price_per_hour: Decimal) -> Decimal | None:
    """Hours ``price_per_hour`` may run on the balance above the floor (0 at or below it);
    None for a free price (no limit)."""
    if price_per_hour <= 0:
        return None
    return max(Decimal(0), balance - floor) / price_per_hour


@dataclass(frozen=True)
class CreditDay:
    """The first scheduled credit after which a start is affordable: when, and which credit."""

    at: datetime
    kind: str  # DAILY.name or MONTHLY.name: the credit without which that day would not suffice


def affording_credit(
    balance: Decimal,
    price_per_hour: Decimal,
    rules: CreditRules,
    now: datetime,
    tz: tzinfo,
    min_hours: Decimal = Decimal(1),
    horizon_days: int = 400,
    *,
    held_per_hour: Decimal = Decimal(0),
) -> CreditDay | None:
    """The first credit time at which ``can_start`` becomes true, assuming nothing else is spent,
    and whether the daily or the monthly credit gets there (a refusal names the right one).

    ``None`` when it already is, or when no credit within the horizon gets there
    (e.g. daily and monthly credits are zero): the refusal message then says so.
    """
    def fits(amount: Decimal) -> bool:
        return can_start(amount, price_per_hour, rules, min_hours, held_per_hour)

    if fits(balance):
        return None
    day = local_day(now, tz)
    for _ in range(horizon_days):
        day += timedelta(days=1)
        monthly = rules.monthly if day.day == 1 else Decimal(0)
        daily_only = balance + capped(rules.daily, balance, rules.max_balance)
        balance += capped(rules.daily + monthly, balance, rules.max_balance)
        if fits(balance):
            kind = DAILY.name if not monthly or fits(daily_only) else MONTHLY.name
            return CreditDay(datetime.combine(day, time(), tz), kind)
    return None


def balance_status(balance: Decimal, rules: CreditRules, low_below: Decimal) -> str:
    """"fine", "low", "negative" or "floor": what the lab widget colours by."""
    if balance <= rules.floor:
        return "floor"
    if balance < 0:
        return "negative"
    if balance < low_below:
        return "low"
    return "fine"


def uncharged_cost(held: Iterable[tuple[Decimal, datetime]], charged_through: datetime, now: datetime) -> Decimal:
    """What the GPU servers ``held`` (price per hour, start) owe for the time since the last
    charged interval ended (``charged_through``), not yet in the balance. The debit job
    charges GPU time an interval after it is used; the floor is about what the user owes,
    so the floor stop counts this too (issue 39.6: with an hour's debit interval a server
    ran on for up to an hour past the floor). Exact: Decimal, microseconds."""
    owed = Decimal(0)
    for price, started in held:
        since = max(started, charged_through)
        if now > since:
            delta = now - since
            seconds = Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 1_000_000
            owed += price * seconds / 3600
    return owed


def floor_reached_at(balance: Decimal, floor: Decimal, held: Iterable[tuple[Decimal, datetime]],
                     charged_through: datetime, now: datetime) -> datetime | None:
    """When the balance, counting GPU time used but not charged yet (:func:`uncharged_cost`),
    reaches ``floor`` at the servers' price: the moment GPU servers are stopped. ``now``
    when it already has; None when nothing is charging."""
    held = list(held)
    burn = sum((price for price, _ in held), Decimal(0))
    if burn <= 0:
        return None
    left = balance - uncharged_cost(held, charged_through, now) - floor
    if left <= 0:
        return now
    return now + timedelta(seconds=float(left / burn * 3600))
