"""The GPU share the pool will free over the coming minutes, per model: the held servers as
they age, and the servers started on what they free, which end and free in their turn.

Pure: no I/O, no clock of its own; ages and times are seconds.

Why: a queue's service rate, as measured over its last minutes (:class:`~gpupool_hub.queue.flow.Drain`),
says how fast it moved, not how fast it will. Right after a burst the held servers are
young; session lengths are heavy-tailed, so their short sessions end first and the pool
frees ever slower as the survivors age (in the time replay at load 0.9 the late waiters of
a burst were shown 9.4 GPUs a second and were served 5.4). The held servers' remaining time,
from the sessions that outlived their present age (:func:`gpupool_hub.queue.estimates.remaining_cdf`),
says how the rate will fall; the servers the queue starts meanwhile end and free again
(a renewal), so it does not fall to nothing.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable

from .estimates import LOG_BUCKET, MIN_TAIL, Running, remaining_cdf
from .history import SessionHistory

#: seconds per step of the forecast, and its steps (40 minutes): the renewal is a sum over
#: pairs of steps, recomputed every half minute for every model the pool has
STEP = 15.0
STEPS = 160
#: beyond the last step the forecast goes on at its rate over this many last steps
TAIL_STEPS = 20
#: a forecast needs most of the held GPU share to be of ages the history has seen outlived
#: (``eta.MIN_TAIL`` sessions longer): a young history does not know how old servers end, and
#: taking their remaining time from all sessions frees them as fast as new ones
MIN_KNOWN_SHARE = 0.5

GRID = [k * STEP for k in range(STEPS + 1)]


class Forecast:
    """Expected GPU milli freed by each step from now, per model (a pool model key)."""

    def __init__(self, running: Iterable[Running], history: SessionHistory) -> None:
        """``running``: the held allocations (each of one model); ``history``: the closed
        sessions their remaining time and their replacements' lengths come from."""
        grouped: dict[tuple[str, int, int, float | None], int] = {}
        samples_of: dict[int, list[float]] = {}
        known = held = 0
        for r in running:
            samples = history.samples(r.profile, r.user)
            samples_of[id(samples)] = samples
            bucket = int(math.log1p(r.age) / LOG_BUCKET)  # ages alike free alike: one CDF per group
            key = (r.model, id(samples), bucket, r.deadline)
            grouped[key] = grouped.get(key, 0) + r.milli
            held += r.milli
            if len(samples) - bisect_right(samples, r.age) >= MIN_TAIL:
                known += r.milli
        ended: dict[str, list[float]] = {}  # per model: the held share ended by each step
        for (model, sid, bucket, deadline), milli in grouped.items():
            ck = (sid, bucket, deadline)
            cdf = history.step_cdfs.get(ck)
            if cdf is None:  # the history's, kept while it is: servers age from bucket to bucket
                age = math.expm1((bucket + 0.5) * LOG_BUCKET)
                cdf = history.step_cdfs[ck] = remaining_cdf(samples_of[sid], age, deadline, GRID)
            by_step = ended.get(model)
            if by_step is None:
                ended[model] = [milli * p for p in cdf]
            else:
                ended[model] = [a + milli * p for a, p in zip(by_step, cdf)]
        released = {m: [0.0] + [e[k] - e[k - 1] for k in range(1, STEPS + 1)] for m, e in ended.items()}
        self.known = known >= MIN_KNOWN_SHARE * held if held else False
        # a session started now ends within step j with these chances (the pool's sessions)
        ends = _step_chances(history.all)
        self.freed: dict[str, list[float]] = {m: _renewed(rel, ends) for m, rel in released.items()}
        self._totals: dict[frozenset[str] | None, list[float]] = {}  # per model set asked about

    def time_to(self, models: frozenset[str] | None, need: float, used: float = 1.0) -> float | None:
        """Seconds until ``used`` of what the pool frees of ``models`` (None: any) adds up to
        ``need`` milli; None when the forecast never gets there (nothing left to free)."""
        return self.until(models, used)(need)

    def until(self, models: frozenset[str] | None, used: float = 1.0) -> Callable[[float], float | None]:
        """:meth:`time_to` for one set of models and share, for many needs (a queue of thousands
        asks about each waiter at every step of a fixed point)."""
        total = self._totals.get(models)
        if total is None:
            curves = [c for m, c in self.freed.items() if models is None or m in models]
            total = self._totals[models] = [sum(c[k] for c in curves) for k in range(STEPS + 1)]
        end = total[STEPS]
        tail = (end - total[STEPS - TAIL_STEPS]) / (TAIL_STEPS * STEP)

        def seconds(need: float) -> float | None:
            if need <= 0:
                return 0.0
            if used <= 0 or end <= 0:
                return None
            need /= used
            k = bisect_right(total, need - 1e-9)
            if k <= STEPS:  # within the forecast: between steps k - 1 and k
                rise = total[k] - total[k - 1]
                return GRID[k - 1] + STEP * (need - total[k - 1]) / rise if rise > 0 else GRID[k]
            return GRID[STEPS] + (need - end) / tail if tail > 0 else None

        return seconds


def _step_chances(sessions: list[float]) -> list[float]:
    """Chance that a session started now ends within each step (index 0: none)."""
    n = len(sessions)
    if not n:
        return [0.0] * (STEPS + 1)
    cdf = [bisect_right(sessions, t) / n for t in GRID]
    return [0.0] + [cdf[k] - cdf[k - 1] for k in range(1, STEPS + 1)]


def _renewed(released: list[float], ends: list[float]) -> list[float]:
    """Cumulative milli freed by each step: what the held servers free, plus what the servers
    started on it free in their turn (each freed share starts a session of the pool's lengths)."""
    freed = [0.0] * (STEPS + 1)
    out = [0.0] * (STEPS + 1)
    for k in range(1, STEPS + 1):
        again = 0.0
        for j in range(1, k):
            if freed[j]:
                again += freed[j] * ends[k - j]
        freed[k] = released[k] + again
        out[k] = out[k - 1] + freed[k]
    return out
