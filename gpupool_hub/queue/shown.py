"""What a researcher reads of an estimate, and how what was shown fared: the range's words
(:func:`shown`, :func:`range_text`), where a figure came from (:func:`source_note`), a range kept
steady while it holds (:func:`steady`) and the accuracy of the shown ranges (:func:`accuracy`). Pure."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from .estimates import Estimate, HORIZON


#: waits shorter than this are said in whole minutes ("1–3 min") and their error measured in seconds
SHORT_S = 300.0
#: a range ending within this many seconds is said "under a minute"; a longer short one spans at
#: least this many whole minutes ("1–3 min"): a wait of a minute or two is not known to the second
UNDER_A_MINUTE_S = 30.0
SHORT_MIN_WIDTH = 2
#: whole minutes a short range starts before its calibrated start: a short queue often moves
#: faster than the starts it was calibrated on (the burst that built it has passed)
SHORT_EARLY_MIN = 1

FALLBACK_NOTE = "no session history yet: estimated from the typical session length"
DEADLINE_NOTE = "from when a server holding such GPUs is due to stop"
#: a shown range is kept while a new point estimate falls within it, widened by this share of the
#: time left to its end and at least ``STEADY_S`` seconds (:func:`steady`)
STEADY_SHARE = 0.15
STEADY_S = 60.0


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
    """Where a single-point estimate (``queue.starts.estimate_starts``) came from: ``"free"`` when
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
