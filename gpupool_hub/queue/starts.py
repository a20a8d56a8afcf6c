"""Today's rule for when a waiter starts, without history (:func:`estimate_starts`: capacity per model
freed by known ends), and the words of a waiter's place (:func:`wait_place`, :func:`wait_text`). Pure."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import accumulate
from operator import attrgetter

from .order import Waiter


@dataclass(frozen=True)
class ExpectedRelease:
    """A held allocation and when it is expected to end (a reclaim deadline, a floor
    stop, or the typical session length), for estimates."""

    node: str
    milli: int
    model: str  # normalized model key
    at: datetime
_AT = attrgetter("at")


def estimate_starts(ordered: Sequence[Waiter], free_milli: Mapping[str, int],
                    releases: Iterable[ExpectedRelease], now: datetime) -> dict[str, datetime | None]:
    """When each waiter is expected to start: GPUs of its models free now plus those
    released by then must cover it and everyone ahead of it wanting those models.

    Counts capacity per model, not per node, so it is a lower bound when nodes
    are fragmented; ``None`` when the known releases never suffice.
    """
    events = sorted(releases, key=_AT)
    # per model set: release times and the running total they free (one bisect per waiter,
    # so a queue of thousands over thousands of held GPUs stays cheap)
    freed: dict[frozenset[str] | None, tuple[list[datetime], list[int]]] = {}
    out: dict[str, datetime | None] = {}
    # per model set seen so far: its own demand, the demand of it and every set sharing a
    # model with it (what a waiter of that set must see covered), those sets, its GPUs free now
    demand: dict[frozenset[str] | None, int] = {}
    need_of: dict[frozenset[str] | None, int] = {}
    sharing: dict[frozenset[str] | None, list[frozenset[str] | None]] = {}
    have_of: dict[frozenset[str] | None, int] = {}
    for w in ordered:
        models = w.request.models
        key = frozenset(models) if models is not None else None
        if key not in sharing:
            others = [k for k in sharing if k is None or key is None or k & key]
            for k in others:
                sharing[k].append(key)
            sharing[key] = others + [key]
            demand[key] = 0
            need_of[key] = sum(demand[k] for k in others)
            have_of[key] = sum(m for model, m in free_milli.items() if models is None or model in models)
        d = w.request.total_gpu_milli
        demand[key] += d
        for k in sharing[key]:
            need_of[k] += d
        need, have = need_of[key], have_of[key]
        if have >= need:
            out[w.id] = now
            continue
        if key not in freed:
            mine = events if models is None else [r for r in events if r.model in models]
            freed[key] = ([r.at for r in mine], list(accumulate(r.milli for r in mine)))
        times, totals = freed[key]
        i = bisect_left(totals, need - have)
        out[w.id] = max(times[i], now) if i < len(totals) else None
    return out


def _nth(position: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(position, f"{position}th")


def wait_place(position: int) -> str:
    """"2nd in the queue"; 0 is a waiter whose GPUs are already reserved."""
    return f"{_nth(position)} in the queue" if position else "GPUs reserved, starting"


def wait_text(position: int, eta: datetime | None, now: datetime, span: str | None = None,
              note: str | None = None) -> str:
    """"you are 2nd, about 20 minutes" — what the progress page says; with ``span`` (a range
    from the pool's history, :func:`gpupool_hub.queue.estimates.range_text`) "about 20–45 min"; ``note``
    says where the figure came from in parentheses (a holder's known end, the typical session)."""
    nth = _nth(position)
    if span is not None:
        if span == "under a minute":
            return f"You are {nth} in the queue; a GPU should free up within a minute."
        return f"You are {nth} in the queue, {span}."
    if note:
        return wait_text(position, eta, now)[:-1] + f" ({note})."
    if eta is None:
        return f"You are {nth} in the queue; no estimate yet (no GPU of this kind is expected to free up soon)."
    minutes = max(0, round((eta - now) / timedelta(minutes=1)))
    if minutes <= 1:
        return f"You are {nth} in the queue; a GPU should free up within a minute."
    if minutes < 90:
        return f"You are {nth} in the queue, about {minutes} minutes."
    return f"You are {nth} in the queue, about {minutes / 60:.1f} hours."
