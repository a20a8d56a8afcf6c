"""The wait queue's estimates: each waiter's expected start and its range learned from
the pool's history, and their kept accuracy.

The queue (:class:`~gpupool_hub.service.core.queue.WaitQueue`) holds one
:class:`QueueEstimates`, which reads the queue's fair order from the order it is
given. The rules are pure (:mod:`gpupool_hub.queue.estimates`, ``queue.starts.estimate_starts``);
this reads their inputs (free GPUs, closed allocations, held ones and their known
ends), caches the answers, and keeps the rate the queue is served at. The queue
records each shown estimate and the real start in the ledger
(``gpupool_estimates``); their accuracy (``accuracy``) is what ``GET queue`` and
the admin pages publish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any, Protocol

from ...queue import estimates as eta_rules
from ...config import GPUPool
from ...ledger import AllocationRecord, Ledger
from ...placement.request import normalize_model
from ...timefmt import iso
from ...queue.starts import ExpectedRelease, estimate_starts
from ...queue.order import Waiter
from .pool_inventory import PoolInventory
from .queue_order import FairQueueOrder
from .reclaims import Reclaims
from .threads import CoreThreads, reads
from ...queue.calibration import CALIBRATION_SPAN, Calibration
from ...queue.flow import Arrivals, Drain, Overtaking
from ...queue.history import SessionHistory, profile_key
from ...queue.shown import accuracy, fallback_source, range_text, steady

#: seconds an estimate or range is reused (they read balances; retries come every few seconds)
ESTIMATE_TTL = 3.0
#: an entry not yet in the cached estimates waits this long for a recomputation (bursts of joins)
ESTIMATE_MIN_AGE = 0.5
#: rounds of "a waiter that starts ends a typical session later" in estimates
CHAIN_ROUNDS = 3
#: seconds the session history (closed allocations of the last HISTORY_DAYS) is reused
HISTORY_TTL = 600.0
HISTORY_DAYS = 90
#: seconds the held allocations and their known ends are reused (they read every holder's balance)
RELEASES_TTL = 30.0
#: starts (and waiters still waiting) read for the calibration: each kind of waiter keeps its
#: latest ``eta.CALIBRATION_SPAN`` of them, as in the time replay
CALIBRATION_READ = 10 * CALIBRATION_SPAN
#: the window of the published accuracy of shown estimates
ACCURACY_DAYS = 30


def _profile(request: dict[str, Any]) -> str:
    """The history key of a stored allocation request (its shape: GPUs, share, MIG profile)."""
    return profile_key(int(request.get("gpus") or 0), int(request.get("gpu_milli") or 0),
                                 request.get("mig"))


def range_json(est: eta_rules.Estimate | None, now: datetime) -> dict[str, Any]:
    """The fields the spawn page and widget show: ``eta_low``/``eta_high``, ``eta_text``, ``eta_basis``."""
    if est is None:
        return {"eta_low": None, "eta_high": None, "eta_text": None, "eta_basis": None, "eta_source": None}
    text = range_text(est, now) if est.basis == "history" or est.low is not None else None
    return {"eta_low": iso(est.low), "eta_high": iso(est.high), "eta_text": text, "eta_basis": est.basis,
            "eta_source": est.origin}


class KnownEnds(Protocol):
    """Who knows when some held allocations end, beyond a typical session (the idle reclaim deadlines)."""

    def deadlines(self) -> dict[str, datetime]:
        """Allocation id -> when it is due to stop."""


class QueueEstimates:
    """Expected starts (today's rule) and start ranges from history, both cached a few
    seconds; the record of what was shown against the real start (its accuracy)."""

    def __init__(self, settings: GPUPool, ledger: Ledger, inventory: PoolInventory, reclaims: Reclaims,
                 order: FairQueueOrder, clock: Callable[[], datetime], *,
                 known_ends: KnownEnds | None = None, threads: CoreThreads | None = None) -> None:
        self.settings, self.ledger, self.inventory, self.reclaims = settings, ledger, inventory, reclaims
        self.order, self.clock, self.threads = order, clock, threads
        # when held allocations are expected to end, beyond the defaults (idle reclaim deadlines)
        self.known_ends = known_ends
        self._estimates: tuple[float, dict[str, datetime | None]] | None = None
        self._releases: tuple[float, list[ExpectedRelease]] | None = None
        self._history: tuple[float, SessionHistory] | None = None
        self._ranges: tuple[float, dict[str, eta_rules.Estimate]] | None = None
        # (when read, held allocations, each one's known end, those ends sorted: fallback_source)
        self._held: tuple[float, list[AllocationRecord], dict[str, datetime], list[datetime]] | None = None
        self._curve_cache: tuple[list[AllocationRecord], SessionHistory, dict[Any, Any]] | None = None
        self._calibration: tuple[float, Calibration] | None = None
        self.served = Drain()  # the GPU share started from the queue lately (for the ranges)
        self.joins = Arrivals()  # who joined lately (those the fair order puts ahead of a waiter)
        self._steady: dict[str, eta_rules.Estimate] = {}  # per entry, the range last shown (eta.steady)
        # per holder: (balance, tokens an hour, floor deadline) when last read. The balance moves only
        # when an interval is charged, so "now + balance / rate" would drift later with the clock
        # between debits (a waiter read 9, 8, 9 min): the deadline is kept until the balance moves
        self._floor_seen: dict[str, tuple[Decimal, Decimal, datetime]] = {}

    def started(self, at: datetime, gpu_milli: int, model: str | None = None) -> None:
        """A waiter's GPUs (of ``model``, a pool model string) were handed over: the queue was
        served that share at ``at``."""
        self.served.add(at.timestamp(), gpu_milli, normalize_model(model) if model else None)

    def freed(self, at: datetime, gpus: Iterable[dict[str, Any]]) -> None:
        """A held allocation's GPUs (``{"milli", "model"}`` each) went back to the pool at ``at``:
        how fast the pool hands out GPUs now (``Rates.freeing_of``: a waiter of one GPU or a share
        is estimated from it where it is faster than the starts of the last ten minutes), and of
        what frees, the part that went to waiters (``Rates.used``, for the replay's ``--forecast``)."""
        for g in gpus:
            self.served.released(at.timestamp(), int(g["milli"]), normalize_model(g["model"]))

    def joined(self, at: datetime, user: str, gpu_milli: int, size: int = 1) -> None:
        """``user`` joined the queue (it waits) asking for ``gpu_milli`` of GPU share, waiting for
        ``size`` whole GPUs of one node (``queue.drains.node_gpus``)."""
        self.joins.add(at.timestamp(), user, gpu_milli, size)

    # ------------------------------------------------- expected starts (today's rule)

    def free_milli(self) -> dict[str, int]:
        """Per model, the whole GPUs free for waiters: not those of the nodes kept whole for a
        profile of more GPUs (``placement.kept``), which a waiter may not take (a one-GPU waiter
        beside them was told "a GPU should free up within a minute" and waited for hours)."""
        pool = self.inventory.pool
        kept = set(pool.kept_nodes())
        out: dict[str, int] = {}
        for ns in pool.nodes:
            if ns.name in kept:
                continue
            for s, mk in enumerate(ns.slot_model):
                if ns.whole[s]:
                    out[mk] = out.get(mk, 0) + ns.free[s]
        return out

    def cached_releases(self) -> list[ExpectedRelease]:
        stamp = self.clock().timestamp()
        if self._releases is None or stamp - self._releases[0] >= RELEASES_TTL:
            self._releases = (stamp, self.releases())
        return self._releases[1]

    def releases(self) -> list[ExpectedRelease]:
        """When each held allocation is expected to end: a reclaim or idle deadline, the
        owner's balance reaching the floor, else the typical session length."""
        now = self.clock()
        typical = timedelta(hours=self.settings.expected_session_hours)
        held, known = self.held_ends()
        out = []
        for r in held:
            at = min(x for x in (known.get(r.id), r.created_at + typical) if x is not None)
            for g in r.gpus:
                out.append(ExpectedRelease(r.node, g["milli"], normalize_model(g["model"]), max(at, now)))
        return out

    def estimate_of(self, entry_id: str) -> datetime | None:
        """One entry's expected start, recomputing for a newcomer unless estimates are very fresh."""
        out = self.estimates()
        if entry_id not in out and self._estimates is not None and (
                self.clock().timestamp() - self._estimates[0] >= ESTIMATE_MIN_AGE):
            self._estimates = None
            out = self.estimates()
        return out.get(entry_id)

    def estimates(self, extra: Waiter | None = None) -> dict[str, datetime | None]:
        """Expected start per waiting entry id (cached a few seconds); with ``extra``, for a
        hypothetical newcomer at the end too (not cached)."""
        stamp = self.clock().timestamp()
        if extra is None and self._estimates is not None and stamp - self._estimates[0] < ESTIMATE_TTL:
            return self._estimates[1]
        ordered = self.order.ordered() + ([extra] if extra is not None else [])
        free, releases, now = self.free_milli(), self.cached_releases(), self.clock()
        out = estimate_starts(ordered, free, releases, now)
        # a waiter expected to start frees its GPUs a typical session later: chain a few rounds
        typical = timedelta(hours=self.settings.expected_session_hours)
        for _ in range(CHAIN_ROUNDS):
            chained = [ExpectedRelease("", w.request.total_gpu_milli, min(w.request.models), at + typical)
                       for w in ordered if (at := out.get(w.id)) is not None and w is not extra
                       and w.request.models]
            again = estimate_starts(ordered, free, releases + chained, now)
            if again == out:
                break
            out = again
        if extra is None:
            self._estimates = (stamp, out)
        return out

    def last_estimates(self) -> dict[str, datetime | None]:
        """The estimates last computed, never recomputed (for readers off the writer thread)."""
        cached = self._estimates  # one read: the writer thread may replace it
        return cached[1] if cached is not None else {}

    def last_shown(self, entry_id: str) -> eta_rules.Estimate | None:
        """The range the entry was last shown (``range_of``, held steady), never recomputed."""
        return self._steady.get(entry_id)

    def last_ranges(self) -> dict[str, eta_rules.Estimate]:
        """The ranges last computed, never recomputed (as ``last_estimates``)."""
        cached = self._ranges
        return cached[1] if cached is not None else {}

    # ------------------------------------------------------- ranges from history

    def history(self) -> SessionHistory:
        """Closed sessions of the last ``HISTORY_DAYS`` (reread every ``HISTORY_TTL`` seconds)."""
        stamp = self.clock().timestamp()
        if self._history is None or stamp - self._history[0] >= HISTORY_TTL:
            released = self.ledger.allocations.session_lengths(self.clock() - timedelta(days=HISTORY_DAYS))
            self._history = (stamp, SessionHistory(
                (_profile(req), user, seconds) for req, user, seconds in released))
        return self._history[1]

    def calibration(self) -> Calibration:
        """The model's estimates against the real starts of the latest waiters, and the misses so
        far of those still waiting past theirs (reread every ``RELEASES_TTL`` seconds): once
        there are enough, ranges are scaled by them."""
        stamp = self.clock().timestamp()
        if self._calibration is None or stamp - self._calibration[0] >= RELEASES_TTL:
            since = self.clock() - timedelta(days=HISTORY_DAYS)
            # the latest starts, enough that each kind of waiter keeps its own latest (as the replay's do)
            pairs = self.ledger.queue.calibration_pairs(since, CALIBRATION_READ)
            cal = Calibration(pairs)
            now = self.clock()
            waiting = [w.id for w in self.order.ordered()][:CALIBRATION_READ]  # each a lower bound of its miss
            cal.waiting((model_s, (now - shown_at).total_seconds(), "")
                        for model_s, shown_at in self.ledger.queue.shown_model_estimates(waiting))
            self._calibration = (stamp, cal)
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
            fair = self.order.fair()
            overtaking = Overtaking(fair, self.joins.rates(stamp), self.order.held_by_user,
                                    partial(self.joins.rates, stamp))
            # the need ahead over the rate the queue was served (the forecast of what frees,
            # issue 41, was 2-3x too long for short waits once the past was the hub's earlier
            # sessions rather than the replayed ones: docs/eta.md, "An honest past")
            out = eta_rules.estimate_ranges(fair.waiters + ([extra] if extra else []), {},
                                            self._held_for_estimates(now), history, now, curves=self._curves(history),
                                            only=extra.id if extra else only, calibration=self.calibration(),
                                            drain=self.served.rates(stamp), overtaking=overtaking)
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

    def _curves(self, history: SessionHistory) -> dict[Any, Any]:
        """The release curves per model set, kept while the held allocations and the history
        they came from are (a curve walks every held allocation: 5,000 in a large pool)."""
        held, _ = self.held_ends()
        cache = self._curve_cache
        if cache is None or cache[0] is not held or cache[1] is not history:
            cache = self._curve_cache = (held, history, {})
        return cache[2]

    def range_of(self, entry_id: str, eta: datetime | None) -> eta_rules.Estimate:
        """The entry's range from history, else today's estimate as a point (``basis`` "fallback",
        its ``source`` a holder's known end or the typical session), held steady against the
        one it was shown last (``eta.steady``)."""
        got = self.ranges().get(entry_id)
        if got is None and (self.history().enough or self.served.rates(self.clock().timestamp())):
            got = self.ranges(only=entry_id).get(entry_id)  # a newcomer: not in the cached ranges yet
        now = self.clock()
        if got is None:
            got = eta_rules.Estimate(eta, eta, eta, "fallback",
                                     source=fallback_source(eta, self._held_now()[3], now))
        shown = self._steady[entry_id] = steady(self._steady.get(entry_id), got, now)
        if len(self._steady) > 4 * max(16, self.order.waiting_count()):  # entries that left: forget them
            waiting = {w.id for w in self.order.ordered()}
            self._steady = {k: v for k, v in self._steady.items() if k in waiting}
        return shown

    @reads
    def accuracy(self) -> dict[str, Any]:
        """The shown estimates against the real starts, over the last ``ACCURACY_DAYS``."""
        rows = self.ledger.queue.started_estimates(self.clock() - timedelta(days=ACCURACY_DAYS))
        return accuracy(rows).json(ACCURACY_DAYS)

    def held_ends(self) -> tuple[list[AllocationRecord], dict[str, datetime]]:
        """The held allocations and the known end of each that has one (cached ``RELEASES_TTL``
        seconds: it reads every holder's balance, and every estimate of a join needs it)."""
        _, held, known, _ = self._held_now()
        return held, known

    def _held_now(self) -> tuple[float, list[AllocationRecord], dict[str, datetime], list[datetime]]:
        """``held_ends``' answer, when it was read and the known ends sorted (``fallback_source``)."""
        stamp = self.clock().timestamp()
        if self._held is None or stamp - self._held[0] >= RELEASES_TTL:
            held = self.ledger.allocations.active()
            known = self._known_ends(held, self.clock())
            self._held = (stamp, held, known, sorted(known.values()))
        return self._held

    def _known_ends(self, held: list[AllocationRecord], now: datetime) -> dict[str, datetime]:
        """When each held allocation is known to end: a reclaim or idle deadline, or its
        owner's balance reaching the floor."""
        ends = {v.id: rc.deadline for rc in self.reclaims.active.values() for v in rc.victims}
        if self.known_ends is not None:
            ends.update(self.known_ends.deadlines())
        burn: dict[str, Decimal] = {}
        for r in held:
            burn[r.user] = burn.get(r.user, Decimal(0)) + r.price_per_hour
        floor_at: dict[str, datetime] = {}
        balances = self.ledger.balances(u for u, rate in burn.items() if rate > 0)
        floor = self.settings.base_rules().floor
        seen = {}
        for user, balance in balances.items():  # no account, no floor to reach
            kept = self._floor_seen.get(user)
            if kept is not None and kept[:2] == (balance, burn[user]):
                floor_at[user] = kept[2]  # not debited since: the same deadline, not one that drifts with now
            else:
                left = balance - floor
                floor_at[user] = now + timedelta(hours=float(max(left, Decimal(0)) / burn[user]))
            seen[user] = (balance, burn[user], floor_at[user])
        self._floor_seen = seen
        out = {}
        for r in held:
            at = min((x for x in (ends.get(r.id), floor_at.get(r.user)) if x is not None), default=None)
            if at is not None:
                out[r.id] = max(at, now)
        return out
