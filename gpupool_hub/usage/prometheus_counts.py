"""An interval's usage from two numbers per series, computed by Prometheus.

Why: the range query answers every point of the grid (10,000 series of 60
points for one hour of a 10,000-user hub), and de-duplicating them at every
step in Prometheus, then decoding and adding the points here, was most of a
debit cycle. But an exporter's series holds one value for as long as a server
holds its GPUs, so ``*_over_time`` subqueries of the raw series over the same
grid say all there is: how many grid points have a sample (``count``), which
value they have (``max``), and which series changed value (``changes``, which
also counts a NaN among numbers; only those series are in its answer).
``value * count`` in :class:`~decimal.Decimal` is then exactly what the range
query's points add up to: both read the same samples at the same instants (a
subquery evaluates its inner expression like a range query whose steps are
multiples of the step, hence the alignment check), and Prometheus writes a
sample value the same way in both answers. The series that changed are read
point by point, de-duplicated as the range query does (:func:`changed_query`).

Copies of one allocation (scraped twice) count once when they hold the same
value at every point. Anything else unusual (copies that differ, a value that
is not a finite, non-negative number, a missing label) returns ``None``, and
the caller reads the whole chunk point by point, whose checks name the
problem or sum it as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["changed_query", "coverage_count_query", "fully_covered", "stats_queries", "sums_from_stats"]

def stats_queries(selector: str, a: int, b: int, step: int) -> tuple[dict[str, str], int] | None:
    """The query of each stat over the grid ``a, a+step, ..., b-step`` and the instant
    to evaluate them at; None when the grid is not aligned to multiples of ``step``
    (a subquery's steps always are).

    The window reaches half a step before ``a`` so that the first point is ``a``
    whether the window is closed on the left (Prometheus 2) or open (Prometheus 3).
    """
    window = _grid_window(a, b, step)
    if window is None:
        return None
    ranged = f"({selector}){window}"
    return {"count": f"count_over_time({ranged})", "max": f"max_over_time({ranged})",
            "changed": f"changes({ranged}) > 0"}, b - step


def changed_query(selector: str, identity: Sequence[str], a: int, b: int, step: int) -> str:
    """The range query of the allocations that changed value within the grid: every copy
    of each, de-duplicated (``max by`` their identity) like the point-by-point query."""
    window = _grid_window(a, b, step)
    assert window is not None
    labels = ", ".join(identity)
    return (f"max by ({labels}) ({selector} and on ({labels}) "
            f"(changes(({selector}){window} @ {b - step}) > 0))")


def sums_from_stats(
    answers: Mapping[str, list[Mapping[str, Any]]], identity: Sequence[str], points: int
) -> tuple[dict[tuple[str, str], Decimal], int] | None:
    """The sum of the grid's values per (user, model) of the series that kept one value, and
    how many allocations changed value (for :func:`changed_query`); None to read point by point.

    ``answers``: each stat's instant vector; ``identity``: the labels naming one
    allocation (copies of it are de-duplicated); ``points``: the grid's length."""
    changed: set[tuple[Any, ...]] = set()
    for series in answers["changed"]:
        labels = series.get("metric")
        if not isinstance(labels, dict):
            return None
        changed.add(tuple(labels.get(k) for k in identity))
    # one series is one label set in both answers (Prometheus writes labels sorted;
    # an answer in another order only costs the point-by-point read)
    stats: dict[tuple[tuple[str, Any], ...], list[Any]] = {}
    for i, stat in enumerate(("count", "max")):
        for series in answers[stat]:
            labels, sample = series.get("metric"), series.get("value")
            if not isinstance(labels, dict) or not isinstance(sample, list) or len(sample) != 2:
                return None
            got = stats.get(key := tuple(labels.items()))
            if got is None:
                got = stats[key] = [labels, None, None]
            got[1 + i] = sample[1]
    parsed: dict[Any, Decimal | None] = {}
    per_identity: dict[tuple[Any, ...], tuple[Decimal, int]] = {}  # value, count
    for labels, raw_count, raw_value in stats.values():
        name = tuple(labels.get(k) for k in identity)
        if name in changed:
            continue
        value, count = _number(raw_value, parsed), _number(raw_count, parsed)
        if value is None or count is None or value < 0 or count != count.to_integral_value():
            return None
        user, model = labels.get("user"), labels.get("model")
        if not (isinstance(user, str) and user and isinstance(model, str) and model):
            return None
        seen = per_identity.get(name)
        if seen is None:
            per_identity[name] = (value, int(count))
        elif not (seen[0] == value and seen[1] == int(count) == points):
            return None  # copies count once only when they hold the same value at every point
    sums: dict[tuple[str, str], Decimal] = {}
    at_user, at_model = identity.index("user"), identity.index("model")
    for name, (value, count) in per_identity.items():
        key = (name[at_user], name[at_model])
        sums[key] = sums.get(key, Decimal(0)) + value * count
    return sums, len(changed)


def coverage_count_query(coverage_query: str, a: int, b: int, step: int) -> tuple[str, int] | None:
    """The instant query counting the grid points at which ``coverage_query`` has
    any series, and its instant; None when the grid is not aligned."""
    window = _grid_window(a, b, step)
    if window is None:
        return None
    return f"count_over_time((count({coverage_query})){window})", b - step


def fully_covered(result: list[Mapping[str, Any]], a: int, b: int, step: int) -> bool:
    """Whether the answer of :func:`coverage_count_query` counts every grid point
    (False sends the caller to the point-by-point check, which names the gap)."""
    if len(result) != 1 or not isinstance(result[0].get("value"), list) or len(result[0]["value"]) != 2:
        return False
    count = _number(result[0]["value"][1], {})
    return count is not None and count == (b - a) // step


def _grid_window(a: int, b: int, step: int) -> str | None:
    if a % step or (b - a) % step or b <= a:
        return None
    return f"[{(b - a) * 1000 - step * 500}ms:{step}s]"


def _number(raw: object, parsed: dict[Any, Decimal | None]) -> Decimal | None:
    """A finite number from a sample's value string (exporters repeat a few: each is parsed once)."""
    if not isinstance(raw, str):
        return None
    if raw in parsed:
        return parsed[raw]
    try:
        value: Decimal | None = Decimal(raw)
    except InvalidOperation:
        value = None
    if value is not None and not value.is_finite():
        value = None
    parsed[raw] = value
    return value
