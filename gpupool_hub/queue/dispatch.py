"""Dispatch: who starts when GPUs free up, with a reservation for the head. Pure.

When GPUs free up, :func:`dispatch`
places waiters in fair order (:mod:`.order`). The first waiter that does not fit is the *head*: it gets a
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

A request of several whole GPUs that fits more nodes than that budget is starved
another way: it starts only where that many GPUs of one node are free at once,
GPUs free one at a time all over the pool, and backfill gives each to the next
small waiter. Slurm's backfill answers with a guarantee: no later job may delay
the start reserved for the queue's head. Notebook servers have no time limit,
so here the guarantee is a *drained* node: each old waiter of several GPUs that
does not fit has nodes of its own drained (:data:`DRAIN_NODES`; those that lack
least for it now), kept from pass to pass (``drained``), and takes the first
of them to empty. Only waiters of several GPUs start on a drained node, in
queue order: each one that does not fit closes the drained nodes it could use
to those after it. So the oldest starts at
the latest when the servers its node held have ended, whatever starts elsewhere.
Drained and closed nodes together stay within the same budget.

Dispatch after a release is cheap: waiters whose request shape already failed
in this pass are skipped without looking at the pool again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from weakref import WeakKeyDictionary, ref

from ..placement import mig as mig_placement
from ..placement.errors import ModelUnavailable, NoCapacity
from ..placement.request import MILLI, Request, model_allowed
from ..placement.scarce import fits_empty
from ..placement.state import Placement, Pool
from .drains import DRAIN_NODES, drain_nodes, needs_drain
from .order import RESERVE_AFTER, Waiter


#: the share of the pool's nodes (at least one) that old waiters may close to backfill, in all (see
#: :func:`dispatch`); in the replay closing up to half of them cost p95 and the estimates' accuracy and
#: gained nothing
CLOSE_AT_MOST = 0.25


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
    #: nodes drained for old waiters of several GPUs (:func:`needs_drain`): pass them to the next pass
    drained: frozenset[str] = frozenset()

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
             reserve_after: timedelta = RESERVE_AFTER, close_at_most: float = CLOSE_AT_MOST,
             drained: frozenset[str] = frozenset()) -> Dispatch:
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

    With ``now``, also, each old waiter of several whole GPUs (:func:`needs_drain`) that does
    not fit and whose nodes were too many to close has ``DRAIN_NODES`` nodes drained for it
    (:func:`drain_nodes`), within the same budget; ``drained`` is the previous pass's
    (``Dispatch.drained``): those a waiter of several GPUs still could use stay drained, so
    the node that drains is the one emptied so far. Only such waiters start on drained nodes,
    in order; one that does not fit closes the drained nodes it could use to those after it.

    Placements are made in ``pool`` under ``new_id(waiter)``; the caller records
    or releases them.
    """
    return _Pass(pool, ordered, new_id, reservation, now, reserve_after, close_at_most, drained).run()


class _Pass:
    """One :func:`dispatch` pass: what it placed and closed so far, as it walks the waiters in order.

    Its state is what the pass learns as it goes: the head and its node, the nodes closed by old
    waiters (and the budget they count against), the nodes kept for waiters that fit few, and per
    side (kept nodes or not) the request shapes and sizes that found no node, so that a queue of
    thousands of distinct shapes stays one scan."""

    __slots__ = ("pool", "ordered", "new_id", "reservation", "reserve_after", "old_before", "placed", "held",
                 "head", "closed", "avoid", "closed_by_class", "claimed", "everything", "budget", "claims",
                 "fits", "kept", "youngest", "started", "union_of", "shortcuts", "drained", "drain_waiters",
                 "undrained")

    def __init__(self, pool: Pool, ordered: Sequence[Waiter], new_id: Callable[[Waiter], str],
                 reservation: tuple[str, str] | None, now: datetime | None, reserve_after: timedelta,
                 close_at_most: float, drained: frozenset[str] = frozenset()) -> None:
        self.pool, self.ordered, self.new_id, self.reservation = pool, ordered, new_id, reservation
        self.reserve_after = reserve_after
        self.old_before = now - reserve_after if now is not None else None
        self.placed: list[tuple[Waiter, Placement]] = []
        self.held: str | None = None
        self.head: Waiter | None = None
        self.closed: set[str] = set()  # the head's node and the nodes old waiters that did not fit could use
        self.avoid: frozenset[str] = frozenset()  # the same, as allocate takes it
        self.closed_by_class: dict[int, frozenset[str]] = {}
        self.claimed: set[int] = set()  # the node sets (by id: :func:`_fits`'s) old waiters already tried to close
        self.everything = len(pool.nodes)
        self.budget = max(1.0, close_at_most * self.everything)
        self.claims: set[str] = set()  # the nodes old waiters closed (the budget's count)
        # each waiter's :func:`_fits`, asked up to three times below: once here (without ``now`` never)
        self.fits = [_fits(pool, w) for w in ordered] if now is not None else [frozenset()] * len(ordered)
        self.kept = _kept(pool, ordered, self.budget, fits=self.fits) if now is not None else frozenset()
        self.youngest: datetime | None = None  # the earliest arrival of a young waiter: ``until`` is its turning old
        self.started: set[str] = set()  # waiters of kept nodes placed in this pass
        # ``avoid | kept``, made again only when either changes (not once per waiter)
        self.union_of = (self.avoid, self.kept, self.avoid | self.kept)
        # per side: the shapes that fit nowhere outside the closed nodes, and per kind of request the
        # (GPUs or share, CPU, memory) of those that found no node: one asking at least as much of
        # each finds none either, since a pass only takes capacity and closes nodes. Waiters that
        # fit only on kept nodes ("inside") take them in order, and waiters of several GPUs may take
        # drained nodes ("drains"); their failures say nothing of the others' and the other way round
        self.shortcuts: dict[tuple[bool, bool], tuple[set[tuple[Any, ...]], dict[Any, list[tuple[int, int, int]]]]] = \
            {(i, d): (set(), {}) for i in (False, True) for d in (False, True)}
        # the previous pass's drained nodes that a waiter of several GPUs could still use
        wanted: set[str] = set()
        if drained and now is not None:
            for w, mine in zip(ordered, self.fits):
                if needs_drain(w):
                    wanted |= mine & drained
        self.drained: frozenset[str] = frozenset(wanted)
        self.drain_waiters = 0  # waiters of several GPUs that did not fit, so far in the pass
        # closed nodes with the drained ones, for waiters that may not start there: (closed, drained, union)
        self.undrained = (self.avoid, self.drained, self.avoid | self.drained)

    def run(self) -> Dispatch:
        # the per-waiter checks stay inline (a pass looks at thousands of waiters, most of them skipped
        # by a shortcut); placing, holding and closing are the methods below
        cls: int | None = None
        old_before, everything, closed, shortcuts = self.old_before, self.everything, self.closed, self.shortcuts
        for w, mine in zip(self.ordered, self.fits):
            if w.priority != cls:
                if cls is not None:
                    self.closed_by_class[cls] = self.avoid
                cls = w.priority
            since = w.since
            old = old_before is not None and since < old_before
            if old_before is not None and not old and (self.youngest is None or since < self.youngest):
                self.youngest = since  # the earliest young waiter: ``until`` is its turning old
            if len(closed) == everything:
                continue  # every node is closed: no one else starts in this pass
            kind, need = w.size
            inside = bool(self.kept) and mine <= self.kept
            drains = bool(self.drained) and needs_drain(w)  # it may start on a drained node
            failed, short = shortcuts[(inside, drains)]
            blocked = False
            if kind is not None and kind in short:  # asks at least as much of each as one that found no node
                a0, c0, m0 = need
                for a, c, m in short[kind]:
                    if a0 >= a and c0 >= c and m0 >= m:
                        blocked = True
                        break
            if not blocked and not (failed and w.shape in failed) and self._place(w, inside, failed, short, drains):
                continue
            if old and id(mine) not in self.claimed:  # it waits: nobody after it starts where it could
                self._close(mine)
            if old and not mine <= closed and needs_drain(w):  # too many nodes to close: some drain for it
                self._drain(w, mine)
        if cls is not None:
            self.closed_by_class[cls] = self.avoid
        return self._answer()

    def _place(self, w: Waiter, inside: bool, failed: set[tuple[Any, ...]],
               short: dict[Any, list[tuple[int, int, int]]], drains: bool = False) -> bool:
        """Place ``w`` off the closed nodes (True), or note why it waits (False)."""
        off = self._off(inside)
        if self.drained and not drains:
            if self.undrained[0] is not off or self.undrained[1] is not self.drained:
                self.undrained = (off, self.drained, off | self.drained)
            off = self.undrained[2]
        r = w.request
        cands = self.pool.candidates(r)
        if not (any(c.name not in off for c in cands) if off else cands):
            self._wait(w, inside, bool(cands), failed, short)
            return False
        try:
            placement = self.pool.allocate(self.new_id(w), r, avoid=off)
        except (NoCapacity, ModelUnavailable):
            failed.add(w.shape)
            return False
        self.placed.append((w, placement))
        if drains and placement.node in self.drained:  # drained for it (or one after it): it took the node
            self.drained = self.drained - {placement.node}
        if inside:  # the nodes it kept are for those still waiting, not for it any more
            self.started.add(w.id)
            self.kept = _kept(self.pool, self.ordered, self.budget, self.started, self.fits)
        return True

    def _off(self, inside: bool) -> frozenset[str]:
        """The nodes ``w`` may not start on: the closed ones, and the kept ones unless it fits only there."""
        if inside or not self.kept:
            return self.avoid
        if self.union_of[0] is not self.avoid or self.union_of[1] is not self.kept:
            self.union_of = (self.avoid, self.kept, self.avoid | self.kept)
        return self.union_of[2]

    def _wait(self, w: Waiter, inside: bool, any_node: bool, failed: set[tuple[Any, ...]],
              short: dict[Any, list[tuple[int, int, int]]]) -> None:
        """``w`` found no node: the first such waiter is the head and holds one; its size is noted."""
        if self.head is None:
            self.head = w
            if self.reservation is not None and self.reservation[0] == w.id:
                self.held = self.reservation[1]
            else:
                self.held = reserve_node(self.pool, w.request, frozenset() if inside else self.kept | self.drained)
            if self.held is not None and self.held not in self.closed:
                self.closed.add(self.held)
                self.avoid = frozenset(self.closed)
        kind, need = w.size
        if kind is None and (not any_node or self.held is None):
            failed.add(w.shape)
        if kind is not None:
            front = short.setdefault(kind, [])
            front[:] = [f for f in front if not (f[0] >= need[0] and f[1] >= need[1] and f[2] >= need[2])]
            front.append(need)

    def _close(self, mine: frozenset[str]) -> None:
        """An old waiter that did not start closes the nodes it could use, within the budget."""
        self.claimed.add(id(mine))  # trying the same nodes again changes nothing: the sets below only grow
        if not mine <= self.closed and len(self.claims | mine) <= self.budget:
            self.claims |= mine
            self.closed |= mine
            self.avoid = frozenset(self.closed)

    def _drain(self, w: Waiter, mine: frozenset[str]) -> None:
        """Old waiter ``w`` of several GPUs did not fit: the nodes drained for it, and for those like
        it ahead (``DRAIN_NODES`` each, within the budget), are closed to everyone after it."""
        self.drain_waiters += 1
        have = self.drained & mine
        head = 1 if self.held is not None and self.held in mine else 0  # the head's node drains for the head
        room = int(self.budget) - len(self.claims | self.drained)
        want = min(DRAIN_NODES * self.drain_waiters - len(have) - head, room)
        if want > 0:
            got = drain_nodes(self.pool, w.request, mine, self.closed | self.drained | self.kept, want)
            self.drained |= got
            have |= got
        if not have <= self.closed:
            self.closed |= have
            self.avoid = frozenset(self.closed)

    def _answer(self) -> Dispatch:
        closed_by_class = self.closed_by_class
        off = self.kept | self.drained
        if off:  # a newcomer that fits elsewhere starts elsewhere (one that fits only there: at the next pass);
            # a newcomer of several GPUs is young: the drained nodes are for the old ones
            closed_by_class = {c: nodes | off for c, nodes in closed_by_class.items()}
        until = self.youngest + self.reserve_after if self.youngest is not None else None
        reservation = (self.head.id, self.held) if self.head is not None and self.held is not None else None
        return Dispatch(self.placed, reservation, closed_by_class, until, self.drained)


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
