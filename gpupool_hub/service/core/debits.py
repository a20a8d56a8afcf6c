"""Charging GPU time: every closed interval once, oldest first, exactly.

Runs in the job thread (usage sources may be slow); each interval's entries are
posted by ``post`` on the service's writer thread. The only writer of
debit entries. Rounding remainders are carried per (user, model) so totals stay
exact for any interval length.

An interval that has closed but not settled yet (``UsageNotSettled``) is not a
failure: it is simply not due, and accounting is not "delayed" for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from ...money.keys import entry_key
from ...ledger import Ledger, Posting
from ...money.pricing import PriceTable, PricingError
from ...timefmt import align_down, iso
from ...money.units import round_milli
from ...usage import Usage, UsageNotSettled, UsageSource, UsageUnavailable
from .threads import CoreThreads, writes

log = logging.getLogger("gpupool.debits")

DEBIT_JOB = "debit"


@dataclass
class DebitStatus:
    """What the last debit attempt said; shown as "accounting delayed" when stuck."""

    last_error: str | None = None
    failing_since: datetime | None = None
    last_attempt: datetime | None = None
    # the oldest uncharged interval is waiting to settle until then (not a failure)
    settling_until: datetime | None = None


class ChargeListener(Protocol):
    """Who must hear that balances changed (the view cache: every account's view is stale)."""

    def forget(self) -> None: ...


class Debits:
    """Turns usage into debit entries, and says whether accounting is up to date."""

    def __init__(self, ledger: Ledger, prices: PriceTable, usage_source: UsageSource, *,
                 interval: int, delay_tolerance: int, clock: Callable[[], datetime],
                 charged: ChargeListener | None = None, threads: CoreThreads | None = None) -> None:
        self.ledger = ledger
        self.prices = prices
        self.usage_source = usage_source
        self.interval = interval
        self.delay_tolerance = delay_tolerance
        self.clock = clock
        self.charged = charged
        self.on_posted: Callable[[list[Posting]], None] = lambda postings: None
        self.threads = threads
        self.status = DebitStatus()
        self._lock = threading.Lock()
        self._last: tuple[tuple[datetime, datetime] | None] | None = None
        self.changed = 0  # bumped on every change of status, for views that cache it

    def last_debit(self) -> tuple[datetime, datetime] | None:
        """The last charged interval, kept in memory (this unit is its only writer)."""
        if self._last is None:
            self._last = (self.ledger.intervals.last(DEBIT_JOB),)
        return self._last[0]

    def next_interval_start(self) -> datetime:
        last = self.last_debit()
        if last is not None:
            return last[1]
        return align_down(self.ledger.epoch(self.clock()), self.interval)

    def accounting_status(self) -> dict[str, Any]:
        """"delayed" only when charging is really behind (past the tolerance) or the
        usage source is failing; an interval waiting to settle is neither."""
        status = self.status
        now = self.clock()
        due = self.next_interval_start() + timedelta(seconds=self.interval)
        if status.settling_until is not None:
            due = max(due, status.settling_until)
        behind = due + timedelta(seconds=self.delay_tolerance) < now
        if status.last_error and (behind or status.failing_since):
            return {"status": "delayed", "message": f"{status.last_error}; usage will be charged when it answers"}
        if behind:
            return {"status": "delayed", "message": "usage for past intervals has not been charged yet"}
        return {"status": "ok", "message": None}

    def debit_due(self, *, max_intervals: int | None = None) -> int:
        """Charge every closed interval not yet charged, oldest first; stop at the first
        that the usage source cannot answer (it is retried on the next run).
        Returns the number of intervals charged.
        """
        with self._lock:
            charged = 0
            while max_intervals is None or charged < max_intervals:
                start = self.next_interval_start()
                end = start + timedelta(seconds=self.interval)
                now = self.clock()
                if end > now:
                    break
                self.status.last_attempt = now
                try:
                    usage = self.usage_source.usage(start, end)
                    postings, carry = self.postings(usage, start, end)
                except UsageNotSettled as e:
                    log.debug("Interval %s–%s not settled yet: %s", iso(start), iso(end), e)
                    self.status.settling_until = e.settled_at
                    break
                except (UsageUnavailable, PricingError) as e:
                    if self.status.failing_since is None:
                        self.status.failing_since = now
                    self.status.last_error = f"usage for {iso(start)}–{iso(end)} unavailable: {e}"
                    self.changed += 1
                    log.warning("Debit delayed: %s", self.status.last_error)
                    break
                self.post.blocking(postings, start, end, carry)
                self.on_posted(postings)
                self._last = ((start, end),)
                self.status.settling_until = None
                self.status.last_error = None
                self.status.failing_since = None
                self.changed += 1
                if self.charged is not None:
                    self.charged.forget()
                charged += 1
                log.info("Charged %s–%s: %d debit(s)", iso(start), iso(end), len(postings))
            return charged

    def report_to(self, on_posted: Callable[[list[Posting]], None]) -> None:
        """Hand each interval's debits, once they are in the ledger, to ``on_posted`` (the
        service's /metrics counts the tokens charged)."""
        self.on_posted = on_posted

    @writes
    def post(self, postings: list[Posting], start: datetime, end: datetime,
             carry: dict[tuple[str, str], Decimal]) -> None:
        """One interval's debits, its completion and the carried remainders, in one transaction."""
        self.ledger.post_many(postings, complete_interval=(DEBIT_JOB, start, end), carry=carry)

    def postings(
        self, usage: Iterable[Usage], start: datetime, end: datetime
    ) -> tuple[list[Posting], dict[tuple[str, str], Decimal]]:
        """Debits for one interval: each rounded to the milli-token with the remainder
        carried to the same user's next debit on that model (MIG profile), so totals stay exact."""
        carried = self.ledger.carries.remainders()
        postings, carry = [], {}
        # one debit per (user, charge key): fractions of several classes of one model add up,
        # each part at its class's price, before the one rounding
        parts: dict[tuple[str, str], tuple[Usage, Decimal, Decimal]] = {}
        cost_of = self.prices.cost
        for u in usage:
            cost = cost_of(u.model, u.gpu_seconds, u.mig_profile, u.share_class)
            part = (u.user, u.charge_key)
            so_far = parts.get(part)
            parts[part] = ((u, cost, u.gpu_seconds) if so_far is None
                           else (so_far[0], so_far[1] + cost, so_far[2] + u.gpu_seconds))
        for (_, key), (u, exact_cost, gpu_seconds) in parts.items():
            profile = u.mig_profile
            exact = exact_cost + carried.get((u.user, key), Decimal(0))
            cost = round_milli(exact)
            carry[(u.user, key)] = exact - cost
            if cost <= 0:
                continue
            hours = (gpu_seconds / 3600).quantize(Decimal("0.001"))
            postings.append(Posting(
                u.user, "debit", -cost, entry_key(DEBIT_JOB, u.user, key, start),
                reason=f"{hours} h of a {profile} MIG instance of {u.model}" if profile else f"{hours} GPU-h of {u.model}",
                interval_start=start, interval_end=end, model=key,
                gpu_seconds=gpu_seconds.quantize(Decimal("0.001")),
            ))
        # only remainders that changed are written (10,000 users' unchanged zeros were most of the write)
        return postings, {k: v for k, v in carry.items() if v != carried.get(k, Decimal(0))}
