"""The wait queue's rules: fair order, dispatch with a reservation for the head,
and estimates of when each waiter starts. Pure: no I/O, no clock of its own.

Order: teams under their quota before borrowers; within each class, round-robin
across users (a user's second server, waiting or running, comes after everyone
else's first), then first come, first served (:func:`fair_order`). So one
user's many servers never push another user back by more than one place. When GPUs free up, :func:`dispatch` places waiters in
that order. The first waiter that does not fit is the *head*: it gets a
reserved node (the node where it will fit soonest, kept until it starts), and
later, smaller waiters may go ahead only on other nodes — Slurm's backfill
with a reservation, so a 4-GPU request is never starved by a stream of 1-GPU
ones. Unlike batch jobs, notebook servers have no time limit, so "finishes
before the head's start" cannot be promised; a node, not a time window, is
reserved.

Dispatch after a release is cheap: waiters whose request shape already failed
in this pass are skipped without looking at the pool again.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from itertools import accumulate
from operator import attrgetter
from typing import Any

from .placement import mig as mig_placement
from .placement.errors import ModelUnavailable, NoCapacity
from .placement.request import MILLI, Request, model_allowed, normalize_model
from .placement.state import Placement, Pool

#: priority classes, lower first
UNDER_QUOTA = 0
BORROWER = 1


@dataclass(frozen=True)
class Waiter:
    """One server waiting for GPUs (``request.models`` already narrowed to what its user affords)."""

    id: str
    user: str
    server: str
    request: Request
    since: datetime
    priority: int = BORROWER

    @property
    def order_key(self) -> tuple[int, datetime, str]:
        return (self.priority, self.since, self.id)

    @cached_property
    def shape(self) -> tuple[Any, ...]:
        r = self.request
        return (r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.models, r.mig)

    @cached_property
    def size(self) -> tuple[tuple[Any, ...] | None, tuple[int, int, int]]:
        """Its kind of request (models; whole GPUs, a share or none) and (GPUs or share, CPU,
        memory): of two of a kind, one asking at least as much of each fits only where the other
        fits. Kind ``None``: pinned or MIG requests, not compared."""
        r = self.request
        kind = None if r.mig or r.required or r.preferred else (r.models, 2 if r.gpus else 1 if r.gpu_milli else 0)
        return kind, (r.gpus or r.gpu_milli, r.cpu_milli, r.memory_mib)


@dataclass(frozen=True)
class ExpectedRelease:
    """A held allocation and when it is expected to end (a reclaim deadline, a floor
    stop, or the typical session length), for estimates."""

    node: str
    milli: int
    model: str  # normalized model key
    at: datetime


@dataclass
class Dispatch:
    """What one pass decided: who starts where, and which node is held for the head."""

    placed: list[tuple[Waiter, Placement]]
    reservation: tuple[str, str] | None  # (waiter id, node)


def fair_order(waiters: Iterable[Waiter], head: str | None = None,
               running: Mapping[str, int] | None = None) -> list[Waiter]:
    """Priority class, then round by round across users, then arrival.

    A waiter's round is how many GPU servers its user already has ahead of it:
    those running (``running``, per user: held allocations and reserved GPUs)
    plus the user's waiters in the same class that arrived before it. So a
    user's second server comes after everyone else's first, whether that first
    one still waits or already runs: a freed GPU never goes to the user it
    just went to while someone with none waits in the same class.

    ``head`` (the id holding a reserved node) goes first in its class: a later
    user's first waiter must not take its place and move the reservation, or
    a big request that is some user's second could starve.
    """
    running = running or {}
    rounds: dict[int, dict[str, int]] = {}  # per class, per user: the round of their next waiter
    arrived = sorted(waiters, key=_ORDER_KEY)
    keys = []
    cls, mine = None, {}
    for w in arrived:
        if w.priority != cls:
            cls, mine = w.priority, rounds.setdefault(w.priority, {})
        turn = mine.get(w.user)
        if turn is None:
            turn = running.get(w.user, 0)
        mine[w.user] = turn + 1
        keys.append((cls, -1 if w.id == head else turn))
    # a stable sort on (class, round) keeps arrival order within a round
    return [arrived[i] for i in sorted(range(len(arrived)), key=keys.__getitem__)]


# sort keys made in C, not a Python call per waiter (the order is resorted on every dispatch)
_ORDER_KEY = attrgetter("priority", "since", "id")  # Waiter.order_key
_AT = attrgetter("at")


def reserve_node(pool: Pool, req: Request) -> str | None:
    """The node to hold back for a head waiter: among nodes it could ever fit on,
    the one with the most free GPU capacity of its models now (ties: fewer GPUs
    in total, so big nodes stay for big requests; then name)."""
    best: tuple[Any, ...] | None = None
    name = None
    for ns in pool.nodes:
        n = ns.node
        if n.cpu_milli < req.cpu_milli or n.memory_mib < req.memory_mib:
            continue
        slots = [s for s, mk in enumerate(ns.slot_model) if model_allowed(mk, req.models)]
        if req.mig:  # only nodes with an instance of its profile; the most of them free first
            if not mig_placement.fits_node(ns, req):
                continue
            free = len(mig_placement.free_instances(ns, req))
        elif req.gpus:
            if sum(1 for s in slots if ns.whole[s]) < req.gpus:
                continue
            free = sum(1 for s in slots if ns.whole[s] and ns.free[s] == MILLI)
        else:
            if not any(ns.cap[s] >= req.gpu_milli for s in slots):
                continue
            free = max((ns.free[s] for s in slots), default=0)
        key = (-free, len(slots), ns.name)
        if best is None or key < best:
            best, name = key, ns.name
    return name


def dispatch(pool: Pool, ordered: Sequence[Waiter], new_id: Callable[[Waiter], str],
             reservation: tuple[str, str] | None = None) -> Dispatch:
    """Place waiters in ``ordered`` order; the first that does not fit holds a node.

    ``reservation`` is the previous pass's (head id, node); it is kept while that
    waiter is still the head, so the node it drains is not given away meanwhile.
    Placements are made in ``pool`` under ``new_id(waiter)``; the caller records
    or releases them.
    """
    placed: list[tuple[Waiter, Placement]] = []
    failed: set[tuple[Any, ...]] = set()  # shapes that fit nowhere (outside the reserved node) this pass
    # per kind of request, the (GPUs or share, CPU, memory) of those that found no node outside
    # the reserved one: a request asking at least as much of each finds none either, since a
    # pass only takes capacity (a queue of thousands of distinct shapes stays one scan)
    short: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
    held: str | None = None
    head: Waiter | None = None
    for w in ordered:
        kind, need = w.size
        if kind is not None and kind in short and _covered(need, short[kind]):
            continue
        if failed and w.shape in failed:
            continue
        r = w.request
        cands = pool.candidates(r)
        usable = [c for c in cands if c.name != held]
        if not usable:
            if head is None:
                head = w
                if reservation is not None and reservation[0] == w.id:
                    held = reservation[1]
                else:
                    held = reserve_node(pool, r)
            if kind is None and (not cands or held is None):
                failed.add(w.shape)
            if kind is not None:
                front = short.setdefault(kind, [])
                front[:] = [f for f in front if not (f[0] >= need[0] and f[1] >= need[1] and f[2] >= need[2])]
                front.append(need)
            continue
        try:
            placement = pool.allocate(new_id(w), w.request, avoid=frozenset({held}) if held else frozenset())
        except (NoCapacity, ModelUnavailable):
            failed.add(w.shape)
            continue
        placed.append((w, placement))
    return Dispatch(placed, (head.id, held) if head is not None and held is not None else None)


def join_behind(pool: Pool, newcomer: Waiter, held: str) -> Placement | None:
    """Where a newcomer starts, when it joins behind a head whose node ``held`` is reserved
    and nothing was released since the last :func:`dispatch` pass.

    That pass left everyone waiting with the head first; since then the pool has only
    lost capacity, so a new pass would place none of them again and would keep the head
    and its node. Only the newcomer can start, off the held node: the same answer as a
    whole pass, in one step instead of one per waiter. The placement is made in ``pool``
    under the newcomer's id; None: it waits."""
    if not any(c.name != held for c in pool.candidates(newcomer.request)):
        return None
    try:
        return pool.allocate(newcomer.id, newcomer.request, avoid=frozenset({held}))
    except (NoCapacity, ModelUnavailable):
        return None


def _covered(need: tuple[int, int, int], front: list[tuple[int, int, int]]) -> bool:
    """Whether ``need`` asks at least as much of each as one of ``front``."""
    a0, c0, m0 = need
    for a, c, m in front:
        if a0 >= a and c0 >= c and m0 >= m:
            return True
    return False


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
    from the pool's history, :func:`gpupool_hub.eta.range_text`) "about 20–45 min"; ``note``
    says why in parentheses (no history yet)."""
    nth = _nth(position)
    if span is not None:
        if span == "within a minute":
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


def demand(waiting: Iterable[tuple[datetime, str, frozenset[str] | None]],
           asks: Iterable[tuple[str, frozenset[str]]]) -> dict[tuple[str, frozenset[str]], datetime | None]:
    """For each (user, models held) in ``asks``: the newest retry of another user's waiting
    entry that GPUs of those models (pool model strings) would serve, or None. That is the
    pressure to cull or reclaim from the holder; a user's own entry never counts.

    ``waiting``: (last retry, user, models wanted: normalised keys, None for any) of each
    waiting entry. One pass over them for all asks, keeping per model the newest retry of
    the two users who retried last: whoever asks, another user's newest is among them."""
    newest: dict[str | None, list[tuple[datetime, str]]] = {}
    for at, user, models in waiting:
        for key in models if models is not None else (None,):
            kept = newest.setdefault(key, [])
            for i, (seen, who) in enumerate(kept):
                if who == user:
                    kept[i] = max(kept[i], (at, user))
                    break
            else:
                kept.append((at, user))
            kept.sort(reverse=True)
            del kept[2:]
    out = {}
    for user, models in asks:
        keys = [normalize_model(m) for m in models]
        out[(user, models)] = max((at for key in (*keys, None) for at, who in newest.get(key, ()) if who != user),
                                  default=None)
    return out
