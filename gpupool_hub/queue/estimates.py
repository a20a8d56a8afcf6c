"""When a waiting server starts, as a range learned from the pool's own history.

Pure: no I/O, no clock of its own. The service feeds it the ledger's closed
allocations (:class:`SessionHistory`) and the allocations held now
(:class:`Running`); the time replay (``benchmarks/replay_openb.py``) feeds it
simulated ones.

Why a survival estimate, not a mean: session lengths are heavy-tailed. A
server that has already run for three hours is not "one hour from the 4-hour
mean"; among past sessions that lasted at least three hours, most lasted far
longer. So each running server's remaining time is drawn from the past
sessions that outlived its present age (its user's own of that profile when
there are enough, else its profile's, else the whole pool's).

Why a range: a waiter starts once enough of the GPUs it can use have freed
up for it and everyone ahead of it. The freed amount by a time ``t`` is a sum
of independent yes/no releases; its distribution is taken as normal (mean and
variance of that sum), which gives, for each quantile ``q``, the first time
the waiter's need is covered with probability ``q``. The shown range is the
``low``–``high`` quantiles (20th–80th percentile by default), the point
estimate the median.

Why a calibration on top: the release model sees GPUs per model, not nodes,
CPU, memory, backfill, or later arrivals that the fair order puts ahead; with
hundreds of servers held its own spread is far too narrow. So once enough
waiters have started (:class:`Calibration`), the range is the model's point
estimate scaled by the 10th–90th percentile of how far off it was for
recent starts (ratios of ``real + 15 s`` to ``estimate + 15 s``), and the
point estimate by their median: the pool's own record corrects the model's
bias and sets the width.

Why that width is the middle 80 % of the misses, not the 20th–80th
percentile: the latter holds three starts in five by construction, and a
researcher plans around a range that holds four in five (the share the admin
pages publish). The model's own range, before there are enough starts,
stays the 20th–80th percentile of its start-time distribution.

``free_milli`` is what the waiters could use now. A waiter still queued after
a dispatch pass could not use what the pool shows free (it is scattered over
nodes, or short of CPU or memory): the time replay passes none for them.

With too little history the estimator says so (``basis == "fallback"``) and
the caller keeps today's rule (:func:`gpupool_hub.queue.starts.estimate_starts`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol
from dataclasses import dataclass
from datetime import datetime, timedelta

from .calibration import Calibration, calibration_class
from .flow import Overtaking, Rates
from .history import SessionHistory, profile_key, quantile
from .order import Waiter


#: quantiles of the shown range and the point estimate, by default
LOW, MID, HIGH = 0.2, 0.5, 0.8
#: past sessions that must outlive a server's age; below that its tail is taken as memoryless
MIN_TAIL = 5
#: the share of recent starts a calibrated range spans (the middle of how far off the model was)
COVERAGE = 0.9
#: the range around a service-rate estimate before there are ``MIN_CALIBRATION`` starts to calibrate on
UNCALIBRATED_SPREAD = (0.5, 2.0)
#: rounds of "those who join ahead while it waits lengthen the wait" (it grows and is bounded)
OVERTAKE_STEPS = 30
#: the estimate's time grid: from now to ``HORIZON`` seconds, each step this factor longer
GRID_FACTOR = 1.06
HORIZON = 14 * 86400.0
#: running servers are grouped by age within this factor (estimates over thousands of servers stay cheap)
AGE_BUCKET = 1.05
LOG_BUCKET = math.log(AGE_BUCKET)


def _grid() -> list[float]:
    out, t = [0.0], 30.0
    while t < HORIZON:
        out.append(t)
        t *= GRID_FACTOR
    out.append(HORIZON)
    return out


GRID = _grid()


@dataclass(frozen=True)
class Running:
    """A held allocation: its GPU share of one model, whose and what it is, how old, and a known end."""

    model: str
    milli: int
    profile: str
    user: str
    age: float  # seconds held so far
    deadline: float | None = None  # seconds from now to a known end (reclaim, idle or floor stop)


class Freeing(Protocol):
    """What the pool will free from now on (:class:`gpupool_hub.queue.forecast.Forecast`)."""

    known: bool  # whether the history has seen most held servers' ages outlived

    def until(self, models: frozenset[str] | None, used: float = 1.0) -> Callable[[float], float | None]:
        """Seconds until ``used`` of what frees of ``models`` adds up to a need in milli (None: never)."""


@dataclass(frozen=True)
class Estimate:
    """A waiter's expected start: ``low``–``high`` is the shown range, ``mid`` the point estimate.
    ``None`` bounds: not within the horizon. ``basis``: ``"history"`` or ``"fallback"``."""

    low: datetime | None
    mid: datetime | None
    high: datetime | None
    basis: str
    model_s: float | None = None  # the release model's own point estimate, seconds from now (for calibration)
    #: where the figure came from, for the words beside it (:func:`source_note`): ``"history"`` (the
    #: pool's record), ``"deadline"`` (a holder's known end), ``"typical"`` (the typical session
    #: length), ``"free"`` (GPUs free now); by default what ``basis`` implies
    source: str = ""

    @property
    def origin(self) -> str:
        return self.source or ("history" if self.basis == "history" else "typical")


def remaining_cdf(samples: Sequence[float], age: float, deadline: float | None = None,
                  grid: Sequence[float] = GRID) -> list[float]:
    """P(the server has ended within each time of ``grid``), given it has run ``age`` seconds.

    The past sessions that outlived ``age`` say how much longer it runs; when
    fewer than ``MIN_TAIL`` did, its remaining time is taken from all sessions
    (no evidence that old servers behave differently)."""
    n = len(samples)
    start = bisect_right(samples, age)
    if n - start >= MIN_TAIL:
        base, left = age, n - start
    else:
        start, base, left = 0, 0.0, n
    out = []
    for t in grid:
        if deadline is not None and t >= deadline:
            out.append(1.0)
        elif left == 0:
            out.append(0.0)
        else:
            out.append((bisect_right(samples, base + t) - start) / left)
    return out


def _normal_tail(need: float, mean: float, var: float) -> float:
    """P(freed ≥ need) for freed ~ Normal(mean, var)."""
    if var <= 1e-9:
        return 1.0 if mean >= need - 1e-6 else 0.0
    return 0.5 * math.erfc((need - mean) / math.sqrt(2 * var))


def _first_time(probs: Sequence[float], q: float) -> float | None:
    """The grid time where ``probs`` first reaches ``q``, interpolated between grid points."""
    prev_p = 0.0
    for i, p in enumerate(probs):
        if p >= q:
            if i == 0 or p <= prev_p:
                return GRID[i]
            frac = (q - prev_p) / (p - prev_p)
            return GRID[i - 1] + frac * (GRID[i] - GRID[i - 1])
        prev_p = p
    return None


def _groups(running: Iterable[Running], history: SessionHistory) -> dict[str, list[tuple[int, int, list[float]]]]:
    """Per model: (count, milli, release CDF) of groups of servers alike in samples, share and age.

    A group's age is its bucket's middle, so its CDF is computed once per history (``history.cdfs``)."""
    grouped: dict[tuple[str, int, int, int, float | None], int] = {}
    samples_of: dict[int, list[float]] = {}
    for r in running:
        s = history.samples(r.profile, r.user)
        samples_of[id(s)] = s
        bucket = int(math.log1p(r.age) / LOG_BUCKET)
        k = (r.model, r.milli, id(s), bucket, r.deadline)
        grouped[k] = grouped.get(k, 0) + 1
    out: dict[str, list[tuple[int, int, list[float]]]] = {}
    for (model, milli, sid, bucket, deadline), count in grouped.items():
        ck = (sid, bucket, deadline)
        cdf = history.cdfs.get(ck)
        if cdf is None:
            age = math.expm1((bucket + 0.5) * LOG_BUCKET) if bucket else 0.0
            cdf = history.cdfs[ck] = remaining_cdf(samples_of[sid], age, deadline)
        out.setdefault(model, []).append((count, milli, cdf))
    return out


def _curve(groups: Sequence[tuple[int, int, list[float]]]) -> tuple[list[float], list[float], float, int]:
    """Mean and variance of the GPU share freed by each grid time, half a typical release
    (the continuity correction: releases come in whole servers, not a smooth flow), and the
    share held in all (no more than that is ever freed in one round)."""
    mean = [0.0] * len(GRID)
    var = [0.0] * len(GRID)
    servers = milli_sum = 0
    for count, milli, cdf in groups:
        servers += count
        milli_sum += count * milli
        for i, p in enumerate(cdf):
            if p:
                mean[i] += count * milli * p
                var[i] += count * milli * milli * p * (1 - p)
    return mean, var, 0.5 * milli_sum / servers if servers else 0.0, milli_sum


def estimate_ranges(ordered: Sequence[Waiter], free_milli: Mapping[str, int], running: Iterable[Running],
                    history: SessionHistory, now: datetime,
                    quantiles: tuple[float, float, float] = (LOW, MID, HIGH),
                    curves: dict[frozenset[str] | None, tuple[list[float], list[float], float, int]] | None = None,
                    only: str | None = None, calibration: Calibration | None = None,
                    drain: float | Rates | None = None, coverage: float | None = None,
                    overtaking: Overtaking | None = None, forecast: Freeing | None = None) -> dict[str, Estimate]:
    """Each waiter's start range, in queue order (``ordered``: fair order, the head first).

    A waiter needs the GPU share of its models that it and everyone ahead of it
    wanting those models ask for, less what is free now; it starts when the
    releases of held allocations of those models cover that. Empty without
    enough history (the caller falls back to today's rule).

    ``curves``: the release curves per model set, filled as needed; a caller may
    keep it for a while (held allocations change slowly) and drop it to refresh.
    ``only``: the one waiter id wanted (those ahead of it still count).
    ``calibration``: past estimates against real starts; once it has enough, the
    range is the model's point estimate scaled by the middle ``coverage`` of its ratios (the
    point estimate by their median).
    ``drain``: the GPU share (milli) the queue has lately been served per second, per model
    (:meth:`Drain.rates`; a number: the whole pool's); where enough waiters of the waiter's
    models started lately, the point estimate is the need ahead of those models over that
    rate (what a busy pool's record says), not the release model's (which ended sessions
    alone bias short); for a waiter of one GPU or a share, the rate the pool freed those
    models over the last two minutes where that is faster (:meth:`Rates.freeing_of`). A
    waiter ahead that accepts more models counts for the part of it that went to this
    waiter's models. Too few starts of its models: the release model of
    its models answers, never the whole pool's rate.
    ``forecast``: what the held servers of each model will free as they age, and those
    started on it after them (:class:`~gpupool_hub.queue.forecast.Forecast`); where it knows
    the held servers' ages and the pool's frees are recorded (``drain``), the measured rate
    gives way to it: the wait is the time until the part of what frees that went to waiters
    lately (:meth:`Rates.used`) covers the need ahead. The rate measured over the last
    minutes lags a pool whose release slows as its servers age.

    A waiter that needs more than the pool holds of its models (a small pool, a
    deep queue) waits for GPUs to be freed, taken by those ahead and freed again:
    each such round adds a whole session (its quantile, from the pool's sessions
    of the waiter's shape) to the time the held servers take to free the rest."""
    rates = Rates.pooled(drain) if isinstance(drain, (int, float)) and drain else \
        drain if isinstance(drain, Rates) else None
    if not history.enough and rates is None:
        return {}
    ranges = _Ranges(free_milli, running, history, now, quantiles, {} if curves is None else curves, calibration,
                     rates, COVERAGE if coverage is None else coverage, overtaking, forecast)
    demand: dict[frozenset[str] | None, int] = {}  # per model set: the need of the waiters so far
    out: dict[str, Estimate] = {}
    for w in ordered:
        models = w.request.models
        key = frozenset(models) if models is not None else None
        demand[key] = demand.get(key, 0) + w.request.total_gpu_milli
        if only is not None and w.id != only:
            continue
        got = ranges.estimate(w, key, demand)
        if got is not None:
            out[w.id] = got
    return out


class _Ranges:
    """What :func:`estimate_ranges` computes once per call and reuses for every waiter: the release
    curves per model set, the share of each waiter ahead that takes this one's GPUs, and the
    forecast's answer per model set."""

    def __init__(self, free_milli: Mapping[str, int], running: Iterable[Running], history: SessionHistory,
                 now: datetime, quantiles: tuple[float, float, float],
                 curves: dict[frozenset[str] | None, tuple[list[float], list[float], float, int]],
                 calibration: Calibration | None, rates: Rates | None, coverage: float,
                 overtaking: Overtaking | None, forecast: Freeing | None) -> None:
        self.free_milli, self.running, self.history, self.now = free_milli, running, history, now
        self.quantiles, self.curves, self.calibration, self.rates = quantiles, curves, calibration, rates
        self.overtaking, self.forecast = overtaking, forecast
        self.calibrated = (0.5 - coverage / 2, quantiles[1], 0.5 + coverage / 2)
        self.groups: dict[str, list[tuple[int, int, list[float]]]] | None = None
        self.shares: dict[tuple[frozenset[str] | None, frozenset[str] | None], float] = {}
        # per model set: seconds until the queue is served a need, by the forecast (None: not known)
        self.untils: dict[frozenset[str] | None, Callable[[float], float | None] | None] = {}

    def _share(self, ahead: frozenset[str] | None, mine: frozenset[str] | None) -> float:
        got = self.shares.get((ahead, mine))
        if got is None:
            got = self.shares[(ahead, mine)] = self.rates.share(ahead, mine) if self.rates is not None else 1.0
        return got

    def estimate(self, w: Waiter, key: frozenset[str] | None,
                 demand: Mapping[frozenset[str] | None, int]) -> Estimate | None:
        """``w``'s range, given the need of everyone up to it per model set (None: the caller's rule)."""
        models = w.request.models
        free = sum(m for model, m in self.free_milli.items() if models is None or model in models)
        rate = self.rates.of(key) if self.rates is not None else None
        if rate and w.request.gpus <= 1:
            # a full pool hands a waiter of one GPU or a share what it frees (Rates.freeing_of);
            # where waiters started faster than GPUs freed (CPU or memory was what they lacked),
            # the starts say so. Several GPUs wait for a node to empty, not for the flow of frees
            rate = max(rate, self.rates.freeing_of(key) or 0.0)
        if rate:
            # of each waiter ahead, the part that takes GPUs this one could use (as the queue was served)
            need = sum(d * self._share(k, key) for k, d in demand.items() if k is None or key is None or k & key) - free
        else:
            need = sum(d for k, d in demand.items() if k is None or key is None or k & key) - free
        if need <= 0:
            return Estimate(self.now, self.now, self.now, "history", 0.0)
        if rate:
            return self._by_rate(w, key, need, rate)
        if not self.history.enough:
            return None  # no measured rate for its models and no history: the caller's rule, said as such
        return self._by_releases(w, key, need)

    def _by_rate(self, w: Waiter, key: frozenset[str] | None, need: float, rate: float) -> Estimate:
        """The need ahead over the rate the queue is served (or the forecast of what frees), with those
        who join ahead while it waits, scaled by past misses."""
        until = None
        if self.forecast is not None and self.forecast.known and w.request.gpus <= 1:
            # (a request of several GPUs waits for a node to drain, not for the flow of what frees)
            if key not in self.untils:
                used = self.rates.used(key) if self.rates is not None else None
                self.untils[key] = self.forecast.until(key, used) if used is not None else None
            until = self.untils[key]
        t = until(need) if until is not None else None
        forecasted = t is not None
        model_s = t if t is not None else need / rate
        if self.overtaking is not None:  # those joining ahead while it waits: the wait they add, to a fixed point
            for _ in range(OVERTAKE_STEPS):
                more = need + self.overtaking.ahead(w, model_s)
                t = until(more) if until is not None else None
                forecasted = t is not None
                longer = t if t is not None else more / rate
                done = longer - model_s <= 0.01 * model_s + 0.5
                model_s = longer
                if done:
                    break
        calibration = self.calibration
        if calibration is not None and calibration.enough:
            # a forecast follows the pool's slowing down or speeding up: the misses of waiters
            # who joined in another phase of it say how wide the range is, not where
            secs = calibration.scales(model_s, self.calibrated, calibration_class(w.request), centred=forecasted,
                                      point=1)
        else:  # no record of misses yet: the point estimate, halved to doubled
            secs = [model_s * UNCALIBRATED_SPREAD[0], model_s, model_s * UNCALIBRATED_SPREAD[1]]
        return Estimate(*(self.now + timedelta(seconds=t) for t in secs), "history", model_s)

    def _by_releases(self, w: Waiter, key: frozenset[str] | None, need: float) -> Estimate:
        """When the held servers of its models will have freed the need (the release model), in rounds
        of whole sessions when the need is more than they hold."""
        models = w.request.models
        if key not in self.curves:
            if self.groups is None:
                self.groups = _groups(self.running, self.history)
            self.curves[key] = _curve([g for model, gs in self.groups.items()
                                       if models is None or model in models for g in gs])
        mean, var, half, held = self.curves[key]
        rounds = -(-(need - held) // held) if 0 < held < need else 0  # ceil: GPUs freed, taken, freed again
        probs = [_normal_tail(need - rounds * held - half, m, v) for m, v in zip(mean, var)]
        session = self.history.samples(profile_key(w.request.gpus, w.request.gpu_milli, w.request.mig), "")

        def first(q: float) -> float | None:
            t = _first_time(probs, q)
            return t + rounds * quantile(session, q) if t is not None and rounds else t

        model_s = first(MID)
        calibration = self.calibration
        if calibration is not None and calibration.enough and model_s is not None:
            at: list[float | None] = [*calibration.scales(model_s, self.calibrated, calibration_class(w.request),
                                                          point=1)]
        else:
            at = [first(q) for q in self.quantiles]
        return Estimate(*(self.now + timedelta(seconds=t) if t is not None else None for t in at), "history",
                        model_s)
