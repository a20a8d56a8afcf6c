"""How far off past estimates were, for recent starts: the range around a point estimate is its
misses' middle share (:class:`Calibration`), per kind of waiter (:func:`calibration_class`). Pure."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from .history import quantile


#: started waiters whose estimate is known before the range is calibrated on them, and the most kept
MIN_CALIBRATION = 50
CALIBRATION_SPAN = 100
#: seconds added to both waits of a calibration ratio (a wait "within a minute" has no useful ratio)
CALIBRATION_PAD = 15.0
#: estimates within this factor of each other are calibrated together, once there are enough (1: off)
CALIBRATION_BUCKET = 2.0


def calibration_class(request: Any) -> tuple[frozenset[str] | None, str]:
    """What a waiter's estimates are calibrated with: the models it accepts and its shape (a
    share of one GPU, one GPU, several: a multi-GPU request waits for a node to drain, not for
    the flow of releases, and the model is off for it differently)."""
    models = request.models
    shape = "multi" if request.gpus > 1 else "one" if request.gpus or request.mig else "share"
    return (frozenset(models) if models is not None else None, shape)


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
        self._started: dict[Any, list[float]] = {}  # the same, of the started waiters alone
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
        with estimates of about this size, its shape with them, any of its side with them (several
        whole GPUs or not), its class, its side.

        Why the sides stay apart: a waiter of several GPUs waits for a node to empty, the others
        for any GPU; where most waiters were of several GPUs (the replay's ``default+multi``) their
        misses, hours past estimates of minutes, scaled the few shares' ranges to a day for waits
        of a minute."""
        bucket = Calibration._bucket(model_s)
        if klass == "":
            return (("", bucket),)
        side = "several" if klass[1] == "multi" else "few"
        return ((klass, bucket), (klass[1], bucket), (side, bucket), klass, side)

    def add(self, model_s: float, real_s: float, klass: Any = "") -> None:
        """``klass``: the waiter's :func:`calibration_class` ("": not known)."""
        ratio = (max(0.0, real_s) + CALIBRATION_PAD) / (max(0.0, model_s) + CALIBRATION_PAD)
        self.ratios.append(ratio)
        for key in self._keys(model_s, klass):
            self.by_key.setdefault(key, deque(maxlen=CALIBRATION_SPAN)).append(ratio)
        self._sorted, self._started = {}, {}

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
            keys = self._keys(model_s, klass)
            for key in keys if len(keys) > 1 else (*keys, ""):
                self.open.setdefault(key, []).append(ratio)
        self._sorted, self._started = {}, {}

    @property
    def enough(self) -> bool:
        return len(self.ratios) >= MIN_CALIBRATION

    def scale(self, model_s: float, q: float, klass: Any = "") -> float:
        """The wait at quantile ``q`` for a model estimate of ``model_s`` seconds, from the misses
        of the most alike waiters there are enough of (:meth:`_keys`), else of all."""
        return self.scales(model_s, (q,), klass)[0]

    def scales(self, model_s: float, qs: Sequence[float], klass: Any = "", centred: bool = False,
               point: int | None = None) -> list[float]:
        """:meth:`scale` at each of ``qs`` (the misses looked up once: a queue of thousands
        asks for three quantiles of each waiter every few seconds). ``centred``: the misses set
        the width around the model's estimate, not where it lies (their median counts as 1).

        ``point``: the index in ``qs`` of the point estimate, read from the waiters that started
        alone. Why: those still waiting past their estimate (:meth:`waiting`) are lower bounds;
        they widen the range as they should, but where thousands wait for hours (waiters of
        eight GPUs at load 1.3 in the replay) the hundred longest of them moved the median as
        well, and estimates of a few minutes became a day."""
        key = next((k for k in self._keys(model_s, klass)
                    if len(self.by_key.get(k, ())) >= MIN_CALIBRATION), "")
        got = self._sorted.get(key)
        if got is None:
            started = self.by_key[key] if key != "" else self.ratios
            got = self._sorted[key] = sorted([*started, *self.open.get(key, ())])
        mid = quantile(got, 0.5) if centred else 1.0
        if point is not None:  # the point estimate from the starts alone (see above)
            done = self._started.get(key)
            if done is None:
                done = self._started[key] = sorted(self.by_key[key] if key != "" else self.ratios)
        return [max(0.0, (model_s + CALIBRATION_PAD) * quantile(done if i == point else got, q) / mid - CALIBRATION_PAD)
                for i, q in enumerate(qs)]
