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
the caller keeps today's rule (:func:`gpupool_hub.queue.rules.estimate_starts`).
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol
from dataclasses import dataclass
from datetime import datetime, timedelta

# how fast the queue moves, measured (kept importable from here: the service and the replay use eta.Drain)
from .flow import DRAIN_WINDOW, MIN_DRAIN_STARTS, Arrivals, Drain, Overtaking, Rates  # noqa: F401
from .rules import Waiter

#: quantiles of the shown range and the point estimate, by default
LOW, MID, HIGH = 0.2, 0.5, 0.8
#: completed sessions the pool needs before estimates come from history
MIN_POOL_SESSIONS = 20
#: sessions of one profile (or one user's of it) before they are used instead of the wider set
MIN_PROFILE_SESSIONS = 10
MIN_USER_SESSIONS = 10
#: past sessions that must outlive a server's age; below that its tail is taken as memoryless
MIN_TAIL = 5
#: the share of recent starts a calibrated range spans (the middle of how far off the model was)
COVERAGE = 0.9
#: started waiters whose estimate is known before the range is calibrated on them, and the most kept
MIN_CALIBRATION = 50
CALIBRATION_SPAN = 100
#: the range around a service-rate estimate before there are ``MIN_CALIBRATION`` starts to calibrate on
UNCALIBRATED_SPREAD = (0.5, 2.0)
#: rounds of "those who join ahead while it waits lengthen the wait" (it grows and is bounded)
OVERTAKE_STEPS = 30
#: seconds added to both waits of a calibration ratio (a wait "within a minute" has no useful ratio)
CALIBRATION_PAD = 15.0
#: estimates within this factor of each other are calibrated together, once there are enough (1: off)
CALIBRATION_BUCKET = 2.0
#: waits shorter than this are said in whole minutes ("1–3 min") and their error measured in seconds
SHORT_S = 300.0
#: a range ending within this many seconds is said "under a minute"; a longer short one spans at
#: least this many whole minutes ("1–3 min"): a wait of a minute or two is not known to the second
UNDER_A_MINUTE_S = 30.0
SHORT_MIN_WIDTH = 2
#: whole minutes a short range starts before its calibrated start: a short queue often moves
#: faster than the starts it was calibrated on (the burst that built it has passed)
SHORT_EARLY_MIN = 1
#: the estimate's time grid: from now to ``HORIZON`` seconds, each step this factor longer
GRID_FACTOR = 1.06
HORIZON = 14 * 86400.0
#: running servers are grouped by age within this factor (estimates over thousands of servers stay cheap)
AGE_BUCKET = 1.05
LOG_BUCKET = math.log(AGE_BUCKET)

FALLBACK_NOTE = "no session history yet: estimated from the typical session length"
DEADLINE_NOTE = "from when a server holding such GPUs is due to stop"
#: a shown range is kept while a new point estimate falls within it, widened by this share of the
#: time left to its end and at least ``STEADY_S`` seconds (:func:`steady`)
STEADY_SHARE = 0.15
STEADY_S = 60.0


def _grid() -> list[float]:
    out, t = [0.0], 30.0
    while t < HORIZON:
        out.append(t)
        t *= GRID_FACTOR
    out.append(HORIZON)
    return out


GRID = _grid()


def profile_key(gpus: int, gpu_milli: int, mig: str | None = None) -> str:
    """The shape a session is filed under: ``"2x1000"``, ``"1x500"``, ``"mig:3g.40gb"``."""
    return f"mig:{mig}" if mig else f"{gpus or 1}x{gpu_milli if not gpus else 1000}"


class SessionHistory:
    """Completed session lengths in seconds (each list sorted), per profile and per (user, profile)."""

    def __init__(self, sessions: Iterable[tuple[str, str, float]] = ()) -> None:
        """``sessions``: (profile key, user, seconds held) of each closed allocation."""
        self.by_profile: dict[str, list[float]] = {}
        self.by_user: dict[tuple[str, str], list[float]] = {}
        self.all: list[float] = []
        # release CDFs per (id of a samples list, age bucket, deadline): valid until the next add
        self.cdfs: dict[tuple[int, int, float | None], list[float]] = {}
        # the same on the forecast's steps (eta_forecast): rebuilt each time the held servers are read
        self.step_cdfs: dict[tuple[int, int, float | None], list[float]] = {}
        for profile, user, seconds in sessions:
            self.add(profile, user, seconds)

    def add(self, profile: str, user: str, seconds: float) -> None:
        s = max(0.0, float(seconds))
        for bucket in (self.by_profile.setdefault(profile, []), self.by_user.setdefault((user, profile), []),
                       self.all):
            insort(bucket, s)  # kept sorted: estimates bisect them
        self.cdfs = {}
        self.step_cdfs = {}

    def __len__(self) -> int:
        return len(self.all)

    @property
    def enough(self) -> bool:
        return len(self.all) >= MIN_POOL_SESSIONS

    def samples(self, profile: str, user: str) -> list[float]:
        """The sorted lengths a server of ``user`` with ``profile`` is judged by."""
        mine = self.by_user.get((user, profile), [])
        if len(mine) >= MIN_USER_SESSIONS:
            chosen = mine
        elif len(self.by_profile.get(profile, ())) >= MIN_PROFILE_SESSIONS:
            chosen = self.by_profile[profile]
        else:
            chosen = self.all
        return chosen


def calibration_class(request: Any) -> tuple[frozenset[str] | None, str]:
    """What a waiter's estimates are calibrated with: the models it accepts and its shape (a
    share of one GPU, one GPU, several: a multi-GPU request waits for a node to drain, not for
    the flow of releases, and the model is off for it differently)."""
    models = request.models
    shape = "multi" if request.gpus > 1 else "one" if request.gpus or request.mig else "share"
    return (frozenset(models) if models is not None else None, shape)


def _quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``xs``, interpolated between neighbours."""
    pos = q * (len(xs) - 1)
    i = int(pos)
    return xs[i] + (xs[min(i + 1, len(xs) - 1)] - xs[i]) * (pos - i)


class Calibration:
    """How the model's point estimate compared with the real wait, for recent starts: in all,
    per set of models the waiters accepted (an A6000 waiter's range is scaled by how far off
    the estimates of A6000 waiters were, once there are enough of them), and per size of the
    estimate (within a factor ``CALIBRATION_BUCKET``: the model is off differently for a wait of
    seconds than for one of an hour)."""

    def __init__(self, pairs: Iterable[tuple[float, float] | tuple[float, float, Any]] = ()) -> None:
        """``pairs``: (the model's point estimate, the real wait) in seconds, oldest first, with the
        waiter's models (a frozenset, None: any) as a third item where known."""
        self.ratios: deque[float] = deque(maxlen=CALIBRATION_SPAN)
        self.by_key: dict[Any, deque[float]] = {}
        self._sorted: dict[Any, list[float]] = {}
        # lower bounds of the misses of waiters still waiting past their estimate (:meth:`waiting`)
        self.open: dict[Any, list[float]] = {}
        for pair in pairs:
            self.add(*pair)

    @staticmethod
    def _bucket(model_s: float) -> int:
        if CALIBRATION_BUCKET <= 1:
            return 0
        return int(math.log(max(0.0, model_s) + CALIBRATION_PAD) / math.log(CALIBRATION_BUCKET))

    @staticmethod
    def _keys(model_s: float, klass: Any) -> tuple[Any, ...]:
        """From the most to the least specific: the waiter's class (:func:`calibration_class`)
        with estimates of about this size, its shape with them, any with them, its class."""
        bucket = Calibration._bucket(model_s)
        if klass == "":
            return (("", bucket),)
        return ((klass, bucket), (klass[1], bucket), ("", bucket), klass)

    def add(self, model_s: float, real_s: float, klass: Any = "") -> None:
        """``klass``: the waiter's :func:`calibration_class` ("": not known)."""
        ratio = (max(0.0, real_s) + CALIBRATION_PAD) / (max(0.0, model_s) + CALIBRATION_PAD)
        self.ratios.append(ratio)
        for key in self._keys(model_s, klass):
            self.by_key.setdefault(key, deque(maxlen=CALIBRATION_SPAN)).append(ratio)
        self._sorted = {}

    def waiting(self, rows: Iterable[tuple[float, float, Any]]) -> None:
        """Waiters still waiting: (the model's estimate, seconds waited so far, class).

        Why: while a queue builds, the starts the ratios come from are the waiters that started
        soon; those still waiting long past their estimate are not among them, and the range
        would stay too short for as long as the queue grows (at load 0.9 of the replay, waits of
        5-15 minutes were shown "under 3 min"). Each one waiting past its estimate counts with
        the ratio it has reached so far (a lower bound: a censored observation), the longest
        waiting first, at most ``CALIBRATION_SPAN`` of them."""
        bounds = sorted(((waited + CALIBRATION_PAD) / (model_s + CALIBRATION_PAD), model_s, klass)
                        for model_s, waited, klass in rows if waited > model_s)[-CALIBRATION_SPAN:]
        self.open = {}
        for ratio, model_s, klass in bounds:
            for key in (*self._keys(model_s, klass), ""):
                self.open.setdefault(key, []).append(ratio)
        self._sorted = {}

    @property
    def enough(self) -> bool:
        return len(self.ratios) >= MIN_CALIBRATION

    def scale(self, model_s: float, q: float, klass: Any = "") -> float:
        """The wait at quantile ``q`` for a model estimate of ``model_s`` seconds, from the misses
        of the most alike waiters there are enough of (:meth:`_keys`), else of all."""
        return self.scales(model_s, (q,), klass)[0]

    def scales(self, model_s: float, qs: Sequence[float], klass: Any = "", centred: bool = False) -> list[float]:
        """:meth:`scale` at each of ``qs`` (the misses looked up once: a queue of thousands
        asks for three quantiles of each waiter every few seconds). ``centred``: the misses set
        the width around the model's estimate, not where it lies (their median counts as 1)."""
        key = next((k for k in self._keys(model_s, klass)
                    if len(self.by_key.get(k, ())) >= MIN_CALIBRATION), "")
        got = self._sorted.get(key)
        if got is None:
            started = self.by_key[key] if key != "" else self.ratios
            got = self._sorted[key] = sorted([*started, *self.open.get(key, ())])
        mid = _quantile(got, 0.5) if centred else 1.0
        return [max(0.0, (model_s + CALIBRATION_PAD) * _quantile(got, q) / mid - CALIBRATION_PAD) for q in qs]


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
    alone bias short). A waiter ahead that accepts more models counts for the part of it
    that went to this waiter's models. Too few starts of its models: the release model of
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
    groups: dict[str, list[tuple[int, int, list[float]]]] | None = None
    curves = {} if curves is None else curves
    coverage = COVERAGE if coverage is None else coverage
    calibrated = (0.5 - coverage / 2, quantiles[1], 0.5 + coverage / 2)
    shares: dict[tuple[frozenset[str] | None, frozenset[str] | None], float] = {}

    def _share(ahead: frozenset[str] | None, mine: frozenset[str] | None) -> float:
        got = shares.get((ahead, mine))
        if got is None:
            got = shares[(ahead, mine)] = rates.share(ahead, mine) if rates is not None else 1.0
        return got

    # per model set: seconds until the queue is served a need, by the forecast (None: not known)
    untils: dict[frozenset[str] | None, Callable[[float], float | None] | None] = {}
    demand: dict[frozenset[str] | None, int] = {}
    out: dict[str, Estimate] = {}
    for w in ordered:
        models = w.request.models
        key = frozenset(models) if models is not None else None
        demand[key] = demand.get(key, 0) + w.request.total_gpu_milli
        if only is not None and w.id != only:
            continue
        free = sum(m for model, m in free_milli.items() if models is None or model in models)
        rate = rates.of(key) if rates is not None else None
        if rate:
            # of each waiter ahead, the part that takes GPUs this one could use (as the queue was served)
            need = sum(d * _share(k, key) for k, d in demand.items() if k is None or key is None or k & key) - free
        else:
            need = sum(d for k, d in demand.items() if k is None or key is None or k & key) - free
        if need <= 0:
            out[w.id] = Estimate(now, now, now, "history", 0.0)
            continue
        if rate:
            until = None
            if forecast is not None and forecast.known and w.request.gpus <= 1:
                # (a request of several GPUs waits for a node to drain, not for the flow of what frees)
                if key not in untils:
                    used = rates.used(key) if rates is not None else None
                    untils[key] = forecast.until(key, used) if used is not None else None
                until = untils[key]
            t = until(need) if until is not None else None
            forecasted = t is not None
            model_s = t if t is not None else need / rate
            if overtaking is not None:  # those joining ahead while it waits: the wait they add, to a fixed point
                for _ in range(OVERTAKE_STEPS):
                    more = need + overtaking.ahead(w, model_s)
                    t = until(more) if until is not None else None
                    forecasted = t is not None
                    longer = t if t is not None else more / rate
                    done = longer - model_s <= 0.01 * model_s + 0.5
                    model_s = longer
                    if done:
                        break
            if calibration is not None and calibration.enough:
                # a forecast follows the pool's slowing down or speeding up: the misses of waiters
                # who joined in another phase of it say how wide the range is, not where
                secs = calibration.scales(model_s, calibrated, calibration_class(w.request), centred=forecasted)
            else:  # no record of misses yet: the point estimate, halved to doubled
                secs = [model_s * UNCALIBRATED_SPREAD[0], model_s, model_s * UNCALIBRATED_SPREAD[1]]
            out[w.id] = Estimate(*(now + timedelta(seconds=t) for t in secs), "history", model_s)
            continue
        if not history.enough:
            continue  # no measured rate for its models and no history: the caller's rule, said as such
        if key not in curves:
            if groups is None:
                groups = _groups(running, history)
            curves[key] = _curve([g for model, gs in groups.items() if models is None or model in models for g in gs])
        mean, var, half, held = curves[key]
        rounds = -(-(need - held) // held) if 0 < held < need else 0  # ceil: GPUs freed, taken, freed again
        probs = [_normal_tail(need - rounds * held - half, m, v) for m, v in zip(mean, var)]
        session = history.samples(profile_key(w.request.gpus, w.request.gpu_milli, w.request.mig), "")

        def first(q: float) -> float | None:
            t = _first_time(probs, q)
            return t + rounds * _quantile(session, q) if t is not None and rounds else t

        model_s = first(MID)
        if calibration is not None and calibration.enough and model_s is not None:
            at: list[float | None] = [*calibration.scales(model_s, calibrated, calibration_class(w.request))]
        else:
            at = [first(q) for q in quantiles]
        out[w.id] = Estimate(*(now + timedelta(seconds=t) if t is not None else None for t in at), "history",
                             model_s)
    return out


def shown(low_s: float | None, high_s: float | None) -> tuple[str, float, float]:
    """The words a range is said in, and the waits in seconds those words cover.

    One function for both, so that "inside the range" in the replay and on the admin
    page is what a researcher read. A range whose end is under ``SHORT_S`` is said in
    whole minutes from the floor of its start to the ceiling of its end ("under a
    minute", "under 3 min", "1–3 min"): a two-minute wait said as "about 2–2 min"
    promises a precision nobody has. Longer ones are rounded ("about 20–45 min",
    "about 1.0–2.2 hours"), and cover what rounds to them."""
    if low_s is None:
        return f"more than {HORIZON / 86400 / 7:g} weeks", HORIZON, math.inf
    low_s = max(0.0, low_s)
    if high_s is None:
        lo = round(low_s / 60)
        text = f"{lo} min" if lo < 90 else f"{lo / 60:.1f} hours"
        return f"at least {text}", max(0.0, lo - 0.5) * 60, math.inf
    high_s = max(low_s, high_s)
    if high_s <= UNDER_A_MINUTE_S:
        return "under a minute", 0.0, 60.0
    if high_s < SHORT_S:
        lo = math.floor(low_s / 60)
        hi = max(math.ceil(high_s / 60), lo + SHORT_MIN_WIDTH)
        lo = max(0, lo - SHORT_EARLY_MIN)
        return (f"under {hi} min" if lo == 0 else f"{lo}–{hi} min"), lo * 60.0, hi * 60.0
    lo, hi = round(low_s / 60), round(high_s / 60)
    if hi >= 90:
        a, b = f"{low_s / 3600:.1f}", f"{high_s / 3600:.1f}"
        text = f"about {a}–{b} hours" if a != b else f"about {b} hours"
        return text, max(0.0, float(a) - 0.05) * 3600, (float(b) + 0.05) * 3600
    text = f"about {lo}–{hi} min" if lo != hi else f"about {hi} min"
    return text, max(0.0, lo - 0.5) * 60, (hi + 0.5) * 60


def range_text(est: Estimate, now: datetime) -> str:
    """"about 20–45 min" (or hours); "under a minute", "1–3 min"; "more than 2 weeks" when not
    within the horizon (:func:`shown`)."""
    low = (est.low - now).total_seconds() if est.low is not None else None
    high = (est.high - now).total_seconds() if est.high is not None else None
    return shown(low, high)[0]


@dataclass(frozen=True)
class Accuracy:
    """How the shown estimates fared: the share of starts inside the shown range (the waits its
    words cover, :func:`shown`), the median |point estimate - real wait| as a share of the real
    wait (a wait under a minute counted as one), and the same split where it means something
    to a researcher: as a share of the wait for waits of ``SHORT_S`` or more, in seconds for
    shorter ones (a two-minute wait estimated as three is a good estimate)."""

    starts: int
    in_range: float | None
    median_error: float | None
    median_error_long: float | None = None
    median_error_short_s: float | None = None
    long_starts: int = 0

    def text(self, days: int) -> str:
        """"last 30 days: 78 % of starts inside the range, median error 22 % for waits of 5 min
        or more, 40 s for shorter ones (120 starts)"."""
        if not self.starts or self.in_range is None or self.median_error is None:
            return f"last {days} days: no waiting server has started yet, so no accuracy to show"
        parts = []
        if self.median_error_long is not None:
            parts.append(f"{self.median_error_long:.0%} for waits of {SHORT_S / 60:g} min or more")
        if self.median_error_short_s is not None:
            parts.append(f"{self.median_error_short_s:.0f} s for shorter ones" if parts
                         else f"{self.median_error_short_s:.0f} s for waits under {SHORT_S / 60:g} min")
        return (f"last {days} days: {self.in_range:.0%} of starts inside the range, median error "
                f"{', '.join(parts)} ({self.starts} starts)").replace("%", " %")

    def json(self, days: int) -> dict[str, object]:
        return {"days": days, "starts": self.starts, "in_range": self.in_range, "median_error": self.median_error,
                "median_error_long": self.median_error_long, "median_error_short_s": self.median_error_short_s,
                "text": self.text(days)}


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs.sort()
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def accuracy(rows: Iterable[tuple[float | None, float | None, float | None, float]]) -> Accuracy:
    """From (low, mid, high, real) waits in seconds; a ``None`` bound is "not within the horizon".

    A start counts as inside when its wait is within what the shown words cover
    (:func:`shown`: "about 10–20 min" holds 9.5 to 20.5 minutes, "1–3 min" 1 to 3)."""
    inside = n = 0
    errors, long_errors, short_errors = [], [], []
    for low, mid, high, real in rows:
        n += 1
        _, lo, hi = shown(low, high)
        inside += lo <= real <= hi
        point = mid if mid is not None else HORIZON
        errors.append(abs(point - real) / max(real, 60.0))
        if real >= SHORT_S:
            long_errors.append(abs(point - real) / real)
        else:
            short_errors.append(abs(point - real))
    if not n:
        return Accuracy(0, None, None)
    short = _median(short_errors)
    long = _median(long_errors)
    return Accuracy(n, round(inside / n, 3), round(_median(errors) or 0.0, 3),
                    None if long is None else round(long, 3), None if short is None else round(short, 1),
                    len(long_errors))


def fallback_source(at: datetime | None, known_ends: Sequence[datetime], now: datetime) -> str:
    """Where a single-point estimate (``waitqueue.estimate_starts``) came from: ``"free"`` when
    it is now, ``"deadline"`` when it is one of the holders' known ends (a reclaim, idle or
    floor stop; an end already passed counts as now), else ``"typical"`` (a held server's
    start plus the typical session).

    ``known_ends`` is sorted, earliest first: the queue asks this for every waiter it shows,
    against the known ends of thousands of held servers, so it looks them up by bisection."""
    if at is None:
        return "typical"
    if at <= now:
        return "free"
    second = timedelta(seconds=1)
    i = bisect_right(known_ends, at - second)  # the first end after at - 1 s: a match if before at + 1 s
    if i < len(known_ends) and known_ends[i] < at + second:
        return "deadline"
    passed = bool(known_ends) and known_ends[0] <= now  # an end passed, counted as now
    return "deadline" if passed and at - now < second else "typical"


def source_note(source: str, typical_hours: float | None = None) -> str | None:
    """The words that say where an estimate came from, beside it; None for the pool's history
    (the range itself says it is learned) and for GPUs free now."""
    if source == "deadline":
        return DEADLINE_NOTE
    if source == "typical":
        return FALLBACK_NOTE + (f" of {typical_hours:g} h" if typical_hours else "")
    return None


def steady(previous: Estimate | None, new: Estimate, now: datetime) -> Estimate:
    """The range to show now, given the one shown before (pure; the caller keeps the last one).

    Why: estimates are recomputed every few seconds from inputs that jitter (a holder's floor
    deadline moves with each debit, a start or a release moves the rate), and a researcher who
    reads "about 9 min", "about 8 min", "about 9 min" trusts none of them. So the shown range,
    as times, is kept while the new point estimate lies within it, widened by ``STEADY_SHARE``
    of the time left to its end (at least ``STEADY_S``), it has not passed, and the figure's
    source is the same: its words then only count down. A real change (a release, a deadline
    that moved by more than that) shows at once."""
    if previous is None or new.mid is None or previous.low is None or previous.high is None or \
            previous.origin != new.origin or previous.high < now:
        return new
    slack = timedelta(seconds=max(STEADY_S, STEADY_SHARE * (previous.high - now).total_seconds()))
    if previous.low - slack <= new.mid <= previous.high + slack:
        return Estimate(previous.low, previous.mid, previous.high, new.basis, new.model_s, new.source)
    return new
