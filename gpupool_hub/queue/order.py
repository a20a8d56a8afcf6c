"""The wait queue's fair order. Pure: no I/O, no clock of its own.

Order: teams under their quota before borrowers; within each class, round-robin
across users (a user's second server, waiting or running, comes after everyone
else's first), then first come, first served (:func:`fair_order`). So one
user's many servers never push another user back by more than one place (among
waiters of the same age group, below)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from itertools import chain
from operator import attrgetter
from typing import Any

from ..placement.request import Request


#: how long a waiter waits before it is *old*: served before younger waiters of its class, and no
#: younger one may start on a node it could use until it has started (see :func:`.dispatch.dispatch`). In the
#: openb replay (docs/eta.md, "Starvation") 1 to 2.5 minutes keep the longest wait within FIFO's;
#: from 3 minutes the nodes the biggest requests need are refilled for hours before they are old.
RESERVE_AFTER = timedelta(minutes=2)
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


def fair_order(waiters: Iterable[Waiter], head: str | None = None,
               running: Mapping[str, int] | None = None, *, now: datetime | None = None,
               reserve_after: timedelta = RESERVE_AFTER) -> list[Waiter]:
    """Priority class, then old waiters before young ones, then round by round across users,
    then arrival.

    A waiter's round is how many GPU servers its user already has ahead of it:
    those running (``running``, per user: held allocations and reserved GPUs)
    plus the user's waiters in the same class that arrived before it. So a
    user's second server comes after everyone else's first, whether that first
    one still waits or already runs: a freed GPU never goes to the user it
    just went to while someone with none waits in the same class.

    ``head`` (the id holding a reserved node) goes first in its class (with ``now``: in
    its class and age group): a later
    user's first waiter must not take its place and move the reservation, or
    a big request that is some user's second could starve.

    With ``now``, a waiter that has waited longer than ``reserve_after`` is old and
    comes before the young ones of its class (in the same round-robin order among
    themselves; the head first among its own age group): :func:`dispatch` lets no younger
    waiter pass it on the nodes it could use. Without ``now``, nobody is old.
    """
    arrived, _, order, _, _ = _sort(waiters, head, running, now, reserve_after)
    return [arrived[i] for i in order]


def _sort(waiters: Iterable[Waiter], head: str | None, running: Mapping[str, int] | None, now: datetime | None,
          reserve_after: timedelta
          ) -> tuple[list[Waiter], list[tuple[int, bool, int]], list[int], dict[int, dict[str, int]],
                     dict[int, dict[str, Waiter]]]:
    """The waiters in arrival order, each one's (class, young, round), the indexes in fair order,
    per class per user the round of their next waiter, and per class per user their latest
    waiter (the order is resorted on every dispatch of a replay or a service: this loop is kept
    lean, and the waiters of one key are gathered as they come instead of sorted)."""
    running = running or {}
    old_before = now - reserve_after if now is not None else None
    rounds: dict[int, dict[str, int]] = {}  # per class, per user: the round of their next waiter
    latest: dict[int, dict[str, Waiter]] = {}
    arrived = sorted(waiters, key=_ORDER_KEY)
    keys = []
    gathered: dict[tuple[int, bool, int], list[int]] = {}  # per key, the indexes in arrival order
    cls, mine, last = None, {}, {}
    i = 0
    for w in arrived:
        if w.priority != cls:
            cls, mine, last = w.priority, rounds.setdefault(w.priority, {}), latest.setdefault(w.priority, {})
        user = w.user
        turn = mine.get(user)
        if turn is None:
            turn = running.get(user, 0)
        mine[user] = turn + 1
        last[user] = w
        key = (cls, old_before is None or w.since >= old_before, -1 if w.id == head else turn)
        keys.append(key)
        same = gathered.get(key)
        if same is None:
            gathered[key] = [i]
        else:
            same.append(i)
        i += 1
    # by (class, age group, round), arrival order within a round: a few hundred keys sorted, not thousands
    order = list(chain.from_iterable(gathered[key] for key in sorted(gathered)))
    return arrived, keys, order, rounds, latest


@dataclass(frozen=True)
class FairOrder:
    """:func:`fair_order`'s answer with what it was sorted by, so that a newcomer can be put
    in its place without sorting everyone again (every spawn of a full pool joins, and
    every waiting spawner asks for its position every few seconds: thousands of waiters
    re-sorted hundreds of times a second otherwise)."""

    waiters: list[Waiter]
    keys: list[tuple[int, bool, int]]  # each waiter's (class, young, round), in order: non-decreasing
    next_round: dict[int, dict[str, int]]  # per class, per user: the round of their next waiter
    latest: dict[tuple[int, str], tuple[int, datetime, str]]  # per (class, user): their latest arrival's key
    #: when the next young waiter turns old (None: none will, or nobody ages): the order holds until then
    until: datetime | None
    aging: timedelta | None  # ``reserve_after`` when it was sorted with a time, else None (nobody ages)

    @classmethod
    def of(cls, waiters: Iterable[Waiter], head: str | None = None, running: Mapping[str, int] | None = None, *,
           now: datetime | None = None, reserve_after: timedelta = RESERVE_AFTER) -> FairOrder:
        arrived, keys, order, rounds, last = _sort(waiters, head, running, now, reserve_after)
        until = None
        if now is not None:
            old_before = now - reserve_after
            young_since = min((w.since for w in arrived if w.since >= old_before), default=None)
            until = None if young_since is None else young_since + reserve_after
        latest = {(c, user): _ORDER_KEY(w) for c, mine in last.items() for user, w in mine.items()}
        return cls([arrived[i] for i in order], [keys[i] for i in order], rounds, latest, until,
                   None if now is None else reserve_after)

    def behind(self, w: Waiter, running: Mapping[str, int]) -> FairOrder | None:
        """This order with ``w``, a young newcomer (no waiter arrived after it), in its place:
        what :meth:`of` would answer for all of them (same head, running and time). None when
        its user has a waiter of its class that sorts after it (the same time, a greater id):
        that one's round would move, so sort them all."""
        arrival = _ORDER_KEY(w)
        mine_latest = self.latest.get((w.priority, w.user))
        if mine_latest is not None and arrival <= mine_latest:
            return None
        mine = self.next_round.get(w.priority, {})
        turn = mine.get(w.user)
        if turn is None:
            turn = running.get(w.user, 0)
        key = (w.priority, True, turn)
        # among equal keys the order is arrival's: after those that arrived before it (all of
        # them, unless some came at the same time with a greater id)
        lo, at = bisect_left(self.keys, key), bisect_right(self.keys, key)
        if at > lo and arrival < _ORDER_KEY(self.waiters[at - 1]):
            at = lo + bisect_right(list(map(_ORDER_KEY, self.waiters[lo:at])), arrival)
        rounds = {**self.next_round, w.priority: {**mine, w.user: turn + 1}}
        until = self.until  # it is the youngest: it turns old first only when nobody else is young
        if until is None and self.aging is not None:
            until = w.since + self.aging
        return FairOrder(self.waiters[:at] + [w] + self.waiters[at:], self.keys[:at] + [key] + self.keys[at:],
                         rounds, {**self.latest, (w.priority, w.user): arrival}, until, self.aging)

    def rekeyed(self, user: str, running: Mapping[str, int], head: str | None, gone: str | None = None
                ) -> FairOrder:
        """This order once ``user``'s running count is ``running[user]`` and their waiter ``gone``
        (if any) left it, ``head`` holding the reserved node (it, or the one before, may be
        ``user``'s): what :meth:`of` would answer, sorted at the same time, with only the
        user's waiters moved (a replay's every start and release would resort thousands).
        ``until`` is kept: it can only come later, so the caller resorts no later than needed."""
        at = [i for i, w in enumerate(self.waiters) if w.user == user]
        if not at:
            return self  # the user waits for nothing: no round of theirs is kept
        ws, ks = list(self.waiters), list(self.keys)
        young = {ws[i].id: ks[i][1] for i in at}
        classes = {ks[i][0] for i in at}
        mine = sorted((ws[i] for i in at if ws[i].id != gone), key=_ORDER_KEY)
        for i in reversed(at):
            del ws[i], ks[i]
        rounds = {c: dict(users) for c, users in self.next_round.items()}
        latest = dict(self.latest)
        for c in classes:
            rounds[c].pop(user, None)
            if not rounds[c]:
                del rounds[c]
            latest.pop((c, user), None)
        turn, cls = 0, None
        for w in mine:  # arrival order: each one's round as _sort counts it
            if w.priority != cls:
                cls, turn = w.priority, running.get(user, 0)
            key = (cls, young[w.id], -1 if w.id == head else turn)
            turn += 1
            rounds.setdefault(cls, {})[user] = turn
            latest[(cls, user)] = arrival = _ORDER_KEY(w)
            lo, hi = bisect_left(ks, key), bisect_right(ks, key)  # among equal keys: arrival order
            place = bisect_right(ws, arrival, lo, hi, key=_ORDER_KEY)
            ws.insert(place, w)
            ks.insert(place, key)
        return FairOrder(ws, ks, rounds, latest, self.until, self.aging)


# sort keys made in C, not a Python call per waiter (the order is resorted on every dispatch)
_ORDER_KEY = attrgetter("priority", "since", "id")  # Waiter.order_key
