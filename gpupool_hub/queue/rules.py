"""The wait queue's rules: fair order, dispatch with a reservation for the head,
and estimates of when each waiter starts. Pure: no I/O, no clock of its own.

Order: teams under their quota before borrowers; within each class, round-robin
across users (a user's second server, waiting or running, comes after everyone
else's first), then first come, first served (:func:`fair_order`). So one
user's many servers never push another user back by more than one place (among
waiters of the same age group, below). When GPUs free up, :func:`dispatch`
places waiters in that order. The first waiter that does not fit is the *head*: it gets a
reserved node (the node where it will fit soonest, kept until it starts), and
later, smaller waiters may go ahead only on other nodes — Slurm's backfill
with a reservation, so a 4-GPU request is never starved by a stream of 1-GPU
ones. Unlike batch jobs, notebook servers have no time limit, so "finishes
before the head's start" cannot be promised; a node, not a time window, is
reserved.

One reserved node is not enough when several big requests wait: the node
held for the head may be one whose servers run for hours, while the other
nodes it could use keep being refilled by backfill, and the next big waiter
only becomes the head when the previous one started. So a waiter that has
waited longer than ``reserve_after`` (:data:`RESERVE_AFTER`) is *old*: old
waiters come first in their class (:func:`fair_order`), and an old waiter
that does not fit closes every node it could ever fit on to everyone after
it (:func:`dispatch`), as long as old waiters close at most ``close_at_most``
(:data:`CLOSE_AT_MOST`) of the pool's nodes (at least one). On those nodes
nothing new starts until it does, as under first come, first served without
backfill, so the first of them to drain is its; elsewhere backfill goes on.
The budget keeps an old request that fits nearly anywhere (it gets the next
GPU that frees where it fits, being first) from turning backfill off.

Age is not the only claim: a request that fits only a few nodes (within the same
budget) cannot be served by the next GPU that frees anywhere, and every server that
lands on one of its nodes while it waits may cost it a whole drain. So, from the
moment it waits, its nodes are *kept* from every waiter that fits elsewhere, ahead
of it in the order or not (:func:`dispatch`): those start elsewhere, where GPUs free
all the time; waiters that fit only the kept nodes take them in order. Placement
does the same before anyone waits (:mod:`.placement.scarce`: scarce nodes last).

Dispatch after a release is cheap: waiters whose request shape already failed
in this pass are skipped without looking at the pool again.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from itertools import accumulate, chain
from operator import attrgetter
from typing import Any
from weakref import WeakKeyDictionary, ref

from ..placement import mig as mig_placement
from ..placement.errors import ModelUnavailable, NoCapacity
from ..placement.request import MILLI, Request, model_allowed, normalize_model
from ..placement.scarce import fits_empty
from ..placement.state import Placement, Pool

#: priority classes, lower first
UNDER_QUOTA = 0
BORROWER = 1

#: how long a waiter waits before it is *old*: served before younger waiters of its class, and no
#: younger one may start on a node it could use until it has started (see :func:`dispatch`). In the
#: openb replay (docs/eta.md, "Starvation") 1 to 2.5 minutes keep the longest wait within FIFO's;
#: from 3 minutes the nodes the biggest requests need are refilled for hours before they are old.
RESERVE_AFTER = timedelta(minutes=2)
#: the share of the pool's nodes (at least one) that old waiters may close to backfill, in all (see
#: :func:`dispatch`); in the replay closing up to half of them cost p95 and the estimates' accuracy and
#: gained nothing
CLOSE_AT_MOST = 0.25


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
    """What one pass decided: who starts where, which node is held for the head, and which
    nodes old waiters closed (per priority class: the nodes closed when that class's last
    waiter was reached, the head's node among them)."""

    placed: list[tuple[Waiter, Placement]]
    reservation: tuple[str, str] | None  # (waiter id, node)
    closed: dict[int, frozenset[str]] = field(default_factory=dict)
    #: when the next waiter becomes old (None: none will): until then a new pass would close the
    #: same nodes, so :func:`join_behind` may stand in for it
    until: datetime | None = None

    def closed_to(self, priority: int) -> frozenset[str]:
        """The nodes a newcomer of class ``priority`` may not start on (it joins behind every
        old waiter of its class and everyone of the classes before it): the head's node and
        the nodes closed by old waiters ahead of it."""
        best = None
        for cls in self.closed:
            if cls <= priority and (best is None or cls > best):
                best = cls
        if best is not None:
            return self.closed[best]
        return frozenset()


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
_AT = attrgetter("at")


# per pool (its node list never changes): per request, the nodes it could ever fit on
_FITTING: WeakKeyDictionary[Pool, dict[Request, frozenset[str]]] = WeakKeyDictionary()


def fitting_nodes(pool: Pool, req: Request) -> frozenset[str]:
    """The nodes ``req`` fits on when they are empty (those of its pinned devices only)."""
    known = _FITTING.get(pool)
    if known is None:
        known = _FITTING[pool] = {}
    got = known.get(req)
    if got is None:
        if len(known) >= 10_000:  # bound memory in a long-lived service
            known.clear()
        got = known[req] = frozenset(ns.name for ns in pool.nodes if fits_empty(ns, req))
    return got


def _fits(pool: Pool, w: Waiter) -> frozenset[str]:
    """:func:`fitting_nodes` of ``w``'s request, remembered on the waiter: a pass asks it for every
    waiter several times, and hashing and comparing the request each time was most of a replay's
    dispatch (waiters of equal requests get the same set, as :func:`fitting_nodes` answers it)."""
    got = w.__dict__.get("_fitting")
    if got is None or got[0]() is not pool:
        got = w.__dict__["_fitting"] = (ref(pool), fitting_nodes(pool, w.request))
    return got[1]


def reserve_node(pool: Pool, req: Request, avoid: frozenset[str] = frozenset()) -> str | None:
    """The node to hold back for a head waiter: among nodes it could ever fit on (but those in
    ``avoid``), the one with the most free GPU capacity of its models now (ties: fewer GPUs
    in total, so big nodes stay for big requests; then name)."""
    best: tuple[Any, ...] | None = None
    name = None
    for ns in pool.nodes:
        if ns.name in avoid:
            continue
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
             reservation: tuple[str, str] | None = None, *, now: datetime | None = None,
             reserve_after: timedelta = RESERVE_AFTER, close_at_most: float = CLOSE_AT_MOST) -> Dispatch:
    """Place waiters in ``ordered`` order; the first that does not fit holds a node, and
    every old waiter that does not fit closes the nodes it could use.

    ``reservation`` is the previous pass's (head id, node); it is kept while that
    waiter is still the head, so the node it drains is not given away meanwhile.

    With ``now``, a waiter that has waited longer than ``reserve_after`` is old: if it
    does not fit, no one after it in this pass may start on any node it could ever fit on
    (:func:`fitting_nodes`), unless old waiters would then close more than
    ``close_at_most`` of the pool's nodes (at least one) in all: then it closes none.

    Why: one reserved node drains only as fast as its longest server, while backfill
    keeps refilling every other node the head could use, and the next big waiter gets a
    node only once the head started; so big requests that fit few nodes waited longer
    than under first come, first served. Closing all their nodes once they are old makes
    the first of those nodes to drain theirs, as without backfill, and leaves backfill
    everywhere else. A request that fits most nodes is not starved that way (being first,
    it gets the next GPU that frees where it fits); letting it close them all would turn
    backfill off (in the openb replay that cost p95 and the estimates' accuracy).

    ``ordered`` should put old waiters first in their class, as ``fair_order(...,
    now=now)`` does: a waiter ahead of an old one may still take what it could use.
    With ``now``, too, the nodes of every waiting request that fits at most that budget of
    nodes (not pinned, not MIG; the fewest-node requests first) are kept from the waiters
    that could ever fit elsewhere, wherever they are in the order, and no head that fits
    elsewhere reserves one (:func:`_kept`): a 1-GPU server ahead of an 8-GPU, 120-CPU one in
    the round-robin would otherwise take the one big node that drained, and the big one
    wait for the next (in the openb replay, an hour). ``closed_to`` includes them.
    Without ``now`` nobody is old and nothing is kept: one reserved node, as before. ``until`` in the answer
    is when the next waiter becomes old (a pass then may close more nodes).

    Placements are made in ``pool`` under ``new_id(waiter)``; the caller records
    or releases them.
    """
    old_before = now - reserve_after if now is not None else None
    placed: list[tuple[Waiter, Placement]] = []
    failed: set[tuple[Any, ...]] = set()  # shapes that fit nowhere (outside the closed nodes) this pass
    # per kind of request, the (GPUs or share, CPU, memory) of those that found no node outside
    # the closed ones: a request asking at least as much of each finds none either, since a
    # pass only takes capacity and closes nodes (a queue of thousands of distinct shapes stays one scan)
    short: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
    held: str | None = None
    head: Waiter | None = None
    closed: set[str] = set()  # the head's node and the nodes old waiters that did not fit could use
    avoid: frozenset[str] = frozenset()  # the same, as allocate takes it
    closed_by_class: dict[int, frozenset[str]] = {}
    claimed: set[int] = set()  # the node sets (by id: :func:`_fits`'s) old waiters already tried to close
    until: datetime | None = None
    cls: int | None = None
    everything = len(pool.nodes)
    budget = max(1.0, close_at_most * everything)
    claims: set[str] = set()  # the nodes old waiters closed (the budget's count)
    # each waiter's :func:`_fits`, asked up to three times below: once here (without ``now`` never)
    fits = [_fits(pool, w) for w in ordered] if now is not None else [frozenset()] * len(ordered)
    kept = _kept(pool, ordered, budget, fits=fits) if now is not None else frozenset()
    youngest: datetime | None = None  # the earliest arrival of a young waiter: ``until`` is its turning old
    started: set[str] = set()  # waiters of kept nodes placed in this pass
    # ``avoid | kept``, made again only when either changes (not once per waiter)
    union_of: tuple[frozenset[str], frozenset[str], frozenset[str]] = (avoid, kept, avoid | kept)
    # waiters that fit only on kept nodes ("inside") take them in order; their failures say
    # nothing of the others' (kept nodes closed) and the other way round: shortcuts per side
    shortcuts = {False: (failed, short), True: (set(), {})}
    for w, mine in zip(ordered, fits):
        if w.priority != cls:
            if cls is not None:
                closed_by_class[cls] = avoid
            cls = w.priority
        since = w.since
        old = old_before is not None and since < old_before
        if old_before is not None and not old and (youngest is None or since < youngest):
            youngest = since
        if len(closed) == everything:
            continue  # every node is closed: no one else starts in this pass
        kind, need = w.size
        inside = bool(kept) and mine <= kept
        failed, short = shortcuts[inside]
        blocked = False
        if kind is not None and kind in short:  # asks at least as much of each as one that found no node
            a0, c0, m0 = need
            for a, c, m in short[kind]:
                if a0 >= a and c0 >= c and m0 >= m:
                    blocked = True
                    break
        if not blocked and not (failed and w.shape in failed):
            if inside or not kept:
                off = avoid
            else:
                if union_of[0] is not avoid or union_of[1] is not kept:
                    union_of = (avoid, kept, avoid | kept)
                off = union_of[2]
            r = w.request
            cands = pool.candidates(r)
            if (any(c.name not in off for c in cands) if off else cands):
                try:
                    placement = pool.allocate(new_id(w), r, avoid=off)
                except (NoCapacity, ModelUnavailable):
                    failed.add(w.shape)
                else:
                    placed.append((w, placement))
                    if inside:  # the nodes it kept are for those still waiting, not for it any more
                        started.add(w.id)
                        kept = _kept(pool, ordered, budget, started, fits)
                    continue
            else:
                if head is None:
                    head = w
                    if reservation is not None and reservation[0] == w.id:
                        held = reservation[1]
                    else:
                        held = reserve_node(pool, r, frozenset() if inside else kept)
                    if held is not None and held not in closed:
                        closed.add(held)
                        avoid = frozenset(closed)
                if kind is None and (not cands or held is None):
                    failed.add(w.shape)
                if kind is not None:
                    front = short.setdefault(kind, [])
                    front[:] = [f for f in front if not (f[0] >= need[0] and f[1] >= need[1] and f[2] >= need[2])]
                    front.append(need)
        if old and id(mine) not in claimed:  # it waits: nobody after it starts where it could
            claimed.add(id(mine))  # trying the same nodes again changes nothing: the sets below only grow
            if not mine <= closed and len(claims | mine) <= budget:
                claims |= mine
                closed |= mine
                avoid = frozenset(closed)
    if cls is not None:
        closed_by_class[cls] = avoid
    if youngest is not None:
        until = youngest + reserve_after
    if kept:  # a newcomer that fits elsewhere starts elsewhere (one that fits only there: at the next pass)
        closed_by_class = {c: nodes | kept for c, nodes in closed_by_class.items()}
    return Dispatch(placed, (head.id, held) if head is not None and held is not None else None,
                    closed_by_class, until)


def _kept(pool: Pool, ordered: Sequence[Waiter], budget: float, started: set[str] | frozenset[str] = frozenset(),
          fits: Sequence[frozenset[str]] | None = None) -> frozenset[str]:
    """The nodes kept for waiters that fit few of them: the nodes each waiting request of a
    comparable kind (not pinned, not MIG) could ever fit on, where they are at most ``budget``
    nodes (those of the fewest-node requests first, within the budget in all). Waiters in
    ``started`` were placed in this pass: they keep nothing. ``fits``: each waiter's
    :func:`_fits`, when the caller has them."""
    homes = []
    seen: set[int] = set()  # node sets by id (:func:`_fits`): one of each is enough, a repeat adds nothing
    # a repeat is skipped first (thousands of waiters share a few dozen sets): whether it may keep is moot
    for w, mine in zip(ordered, fits if fits is not None else [_fits(pool, w) for w in ordered]):
        if id(mine) in seen or w.size[0] is None or w.id in started:
            continue
        seen.add(id(mine))
        if mine and len(mine) <= budget:
            homes.append(mine)
    kept: frozenset[str] = frozenset()
    for mine in sorted(homes, key=len):
        if len(kept | mine) <= budget:
            kept |= mine
    return kept


def join_behind(pool: Pool, newcomer: Waiter, held: str | frozenset[str]) -> Placement | None:
    """Where a newcomer starts, when it joins behind a head whose node is reserved, nothing
    was released since the last :func:`dispatch` pass and no waiter became old since
    (before that pass's ``until``). ``held``: the nodes closed to it, that pass's
    ``closed_to(newcomer.priority)`` (a single name: the head's node, nobody old).

    That pass left everyone waiting with the head first; since then the pool has only
    lost capacity, so a new pass would place none of them again, would keep the head
    and its node, and the same old waiters would close the same nodes. Only the newcomer
    (young, behind every old waiter of its class) can start, off the closed nodes: the
    same answer as a whole pass, in one step instead of one per waiter. The placement is
    made in ``pool`` under the newcomer's id; None: it waits."""
    avoid = frozenset({held}) if isinstance(held, str) else held
    if not any(c.name not in avoid for c in pool.candidates(newcomer.request)):
        return None
    try:
        return pool.allocate(newcomer.id, newcomer.request, avoid=avoid)
    except (NoCapacity, ModelUnavailable):
        return None


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
