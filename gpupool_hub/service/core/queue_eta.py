"""The wait queue's estimates learned from the pool's history, and their kept accuracy.

A half of :class:`~gpupool_hub.service.core.queue.WaitQueue` (its base), apart so
that each stays readable: the rules are pure (:mod:`gpupool_hub.eta`); this
reads their inputs (closed allocations, held ones and their known ends),
caches the ranges, and records each shown estimate and the real start in the
ledger (``gpupool_estimates``), whose accuracy ``GET queue`` and the admin
pages publish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ... import eta as eta_rules
from ...config import GPUPool
from ...ledger import AllocationRecord, Ledger
from ...placement.request import normalize_model
from ...timefmt import iso
from ...waitqueue import Waiter
from .reclaims import Reclaims
from .threads import reads

#: seconds an estimate or range is reused (they read balances; retries come every few seconds)
ESTIMATE_TTL = 3.0
#: seconds the session history (closed allocations of the last HISTORY_DAYS) is reused
HISTORY_TTL = 600.0
HISTORY_DAYS = 90
#: seconds the held allocations and their known ends are reused (they read every holder's balance)
RELEASES_TTL = 30.0
#: the window of the published accuracy of shown estimates
ACCURACY_DAYS = 30


def _profile(request: dict[str, Any]) -> str:
    """The history key of a stored allocation request (its shape: GPUs, share, MIG profile)."""
    return eta_rules.profile_key(int(request.get("gpus") or 0), int(request.get("gpu_milli") or 0),
                                 request.get("mig"))



class QueueRanges:
    """Start ranges from history, and the record of what was shown against the real start."""

    settings: GPUPool
    ledger: Ledger
    reclaims: Reclaims
    clock: Callable[[], datetime]
    expected_ends: Callable[[], dict[str, datetime]]
    _history: tuple[float, eta_rules.SessionHistory] | None = None
    _ranges: tuple[float, dict[str, eta_rules.Estimate]] | None = None
    _held: tuple[float, list[AllocationRecord], dict[str, datetime]] | None = None
    _curve_cache: tuple[list[AllocationRecord], eta_rules.SessionHistory, dict[Any, Any]] | None = None
    _calibration: tuple[float, eta_rules.Calibration] | None = None
    served: eta_rules.Drain

    def ordered(self) -> list[Waiter]:  # provided by WaitQueue
        raise NotImplementedError("Subclass must provide implementation")

    def history(self) -> eta_rules.SessionHistory:
        """Closed sessions of the last ``HISTORY_DAYS`` (reread every ``HISTORY_TTL`` seconds)."""
        stamp = self.clock().timestamp()
        if self._history is None or stamp - self._history[0] >= HISTORY_TTL:
            released = self.ledger.allocations.session_lengths(self.clock() - timedelta(days=HISTORY_DAYS))
            self._history = (stamp, eta_rules.SessionHistory(
                (_profile(req), user, seconds) for req, user, seconds in released))
        return self._history[1]

    def calibration(self) -> eta_rules.Calibration:
        """The model's estimates against the real starts of the latest waiters (reread every
        ``RELEASES_TTL`` seconds): once there are enough, ranges are scaled by them."""
        stamp = self.clock().timestamp()
        if self._calibration is None or stamp - self._calibration[0] >= RELEASES_TTL:
            since = self.clock() - timedelta(days=HISTORY_DAYS)
            pairs = self.ledger.queue.calibration_pairs(since, eta_rules.CALIBRATION_SPAN)
            self._calibration = (stamp, eta_rules.Calibration(pairs))
        return self._calibration[1]

    def ranges(self, extra: Waiter | None = None, only: str | None = None) -> dict[str, eta_rules.Estimate]:
        """Each waiting entry's start range (cached like ``estimates``); empty without history.
        With ``extra``, only that hypothetical newcomer's, at the end; with ``only``, only that
        waiting entry's (neither is cached).

        What the pool shows free counts for nobody here: a waiter still waiting after a
        dispatch pass could not use it (scattered over nodes, or short of CPU or memory)."""
        stamp = self.clock().timestamp()
        if extra is not None or only is not None or self._ranges is None or stamp - self._ranges[0] >= ESTIMATE_TTL:
            now = self.clock()
            history = self.history()
            out = eta_rules.estimate_ranges(self.ordered() + ([extra] if extra else []), {},
                                            self._held_for_estimates(now), history, now, curves=self._curves(history),
                                            only=extra.id if extra else only, calibration=self.calibration(),
                                            drain=self.served.rate(stamp))
            if extra is not None or only is not None:
                return out
            self._ranges = (stamp, out)
        return self._ranges[1]

    def _held_for_estimates(self, now: datetime) -> Iterator[eta_rules.Running]:
        """The held allocations as the estimator sees them (read only when a curve is missing)."""
        held, ends = self.held_ends()
        for r in held:
            if r.gpus:
                at = ends.get(r.id)
                yield eta_rules.Running(normalize_model(r.gpus[0]["model"]), sum(g["milli"] for g in r.gpus),
                                        _profile(r.request), r.user, (now - r.created_at).total_seconds(),
                                        None if at is None else max(0.0, (at - now).total_seconds()))

    def _curves(self, history: eta_rules.SessionHistory) -> dict[Any, Any]:
        """The release curves per model set, kept while the held allocations and the history
        they came from are (a curve walks every held allocation: 5,000 in a large pool)."""
        held, _ = self.held_ends()
        cache = self._curve_cache
        if cache is None or cache[0] is not held or cache[1] is not history:
            cache = self._curve_cache = (held, history, {})
        return cache[2]

    def range_of(self, entry_id: str, eta: datetime | None) -> eta_rules.Estimate:
        """The entry's range from history, else today's estimate as a point (``basis`` "fallback")."""
        got = self.ranges().get(entry_id)
        if got is None and self.history().enough:  # a newcomer: not in the cached ranges yet
            got = self.ranges(only=entry_id).get(entry_id)
        return got if got is not None else eta_rules.Estimate(eta, eta, eta, "fallback")

    @staticmethod
    def _range_json(est: eta_rules.Estimate | None, now: datetime) -> dict[str, Any]:
        """The fields the spawn page and widget show: ``eta_low``/``eta_high``, ``eta_text``, ``eta_basis``."""
        if est is None:
            return {"eta_low": None, "eta_high": None, "eta_text": None, "eta_basis": None}
        text = eta_rules.range_text(est, now) if est.basis == "history" or est.low is not None else None
        return {"eta_low": iso(est.low), "eta_high": iso(est.high), "eta_text": text, "eta_basis": est.basis}

    @reads
    def accuracy(self) -> dict[str, Any]:
        """The shown estimates against the real starts, over the last ``ACCURACY_DAYS``."""
        rows = self.ledger.queue.started_estimates(self.clock() - timedelta(days=ACCURACY_DAYS))
        return eta_rules.accuracy(rows).json(ACCURACY_DAYS)

    def held_ends(self) -> tuple[list[AllocationRecord], dict[str, datetime]]:
        """The held allocations and the known end of each that has one (cached ``RELEASES_TTL``
        seconds: it reads every holder's balance, and every estimate of a join needs it)."""
        stamp = self.clock().timestamp()
        if self._held is None or stamp - self._held[0] >= RELEASES_TTL:
            held = self.ledger.allocations.active()
            self._held = (stamp, held, self._known_ends(held, self.clock()))
        return self._held[1], self._held[2]

    def _known_ends(self, held: list[AllocationRecord], now: datetime) -> dict[str, datetime]:
        """When each held allocation is known to end: a reclaim or idle deadline, or its
        owner's balance reaching the floor."""
        ends = {v.id: rc.deadline for rc in self.reclaims.active.values() for v in rc.victims}
        ends.update(self.expected_ends())
        burn: dict[str, Decimal] = {}
        for r in held:
            burn[r.user] = burn.get(r.user, Decimal(0)) + r.price_per_hour
        floor_at: dict[str, datetime] = {}
        balances = self.ledger.balances(u for u, rate in burn.items() if rate > 0)
        floor = self.settings.base_rules().floor
        for user, balance in balances.items():  # no account, no floor to reach
            left = balance - floor
            floor_at[user] = now + timedelta(hours=float(max(left, Decimal(0)) / burn[user]))
        out = {}
        for r in held:
            at = min((x for x in (ends.get(r.id), floor_at.get(r.user)) if x is not None), default=None)
            if at is not None:
                out[r.id] = max(at, now)
        return out
