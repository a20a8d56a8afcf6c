"""How fast the wait queue moves, as measured: the GPU share it was served lately, per model
(:class:`Drain`, :class:`Rates`), and the later arrivals that its round-robin order puts ahead
of a waiter (:class:`Arrivals`, :class:`Overtaking`).

Pure: no I/O, no clock of its own; times are seconds on any fixed clock. The estimator
(:mod:`gpupool_hub.queue.estimates`) turns these into a waiter's point estimate: the need ahead of it,
plus what will join ahead of it while it waits, over the rate the queue is served.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from .drains import node_gpus
from .order import FairOrder, Waiter

_ID = attrgetter("id")  # a waiter's id, read in C (the index of a queue of thousands is built per estimate)

#: the window over which the queue's service rate and its users' arrivals are measured, and
#: the starts a service rate needs
DRAIN_WINDOW = 600.0
MIN_DRAIN_STARTS = 10
#: the latest seconds whose frees say how fast the pool hands out GPUs now (:meth:`Rates.freeing_of`)
FREEING_WINDOW = 120.0


class Drain:
    """The GPU share the queue was served lately, per model: starts of waiters, per second.

    Why: while a queue builds, the sessions that ended are the short ones, and
    the release model learns from them that GPUs free up fast. The rate at
    which waiters really started says how fast the queue moves now. Per model,
    because an A6000 waiter starts as fast as A6000s free up, not as fast as
    the whole pool does."""

    def __init__(self) -> None:
        # (seconds, GPU share in milli, model key: None when unknown), oldest first
        self.starts: deque[tuple[float, int, str | None]] = deque()
        # (seconds, GPU share in milli, model key) of held allocations that ended, oldest first
        self.ends: deque[tuple[float, int, str]] = deque()

    def released(self, at: float, milli: int, model: str) -> None:
        """A held allocation's ``milli`` of GPU share of ``model`` was freed at ``at``: of what the
        pool frees, the part that goes to waiters is what serves the queue."""
        self.ends.append((at, milli, model))

    def add(self, at: float, milli: int, model: str | None = None) -> None:
        """A waiter started at ``at`` with ``milli`` of GPU share of ``model``."""
        self.starts.append((at, milli, model))

    def rates(self, now: float) -> Rates | None:
        """Milli-GPUs served per second over the last ``DRAIN_WINDOW``, per model, and freed
        over the same span and over the last ``FREEING_WINDOW``; None with too few starts in all."""
        cut = now - DRAIN_WINDOW
        while self.starts and self.starts[0][0] < cut:
            self.starts.popleft()
        while self.ends and self.ends[0][0] < cut:
            self.ends.popleft()
        if len(self.starts) < MIN_DRAIN_STARTS:
            return None
        first = self.starts[0][0]
        span = max(now - max(cut, first), 1.0)
        milli: dict[str | None, float] = {}
        count: dict[str | None, int] = {}
        for _, m, model in self.starts:
            milli[model] = milli.get(model, 0.0) + m / span
            count[model] = count.get(model, 0) + 1
        freed: dict[str, float] = {}
        freeing: dict[str, float] = {}
        lately = now - FREEING_WINDOW
        for at, m, model in self.ends:  # over the same span: before the first start, nobody waited
            if at >= first:
                freed[model] = freed.get(model, 0.0) + m / span
            if at >= lately:
                freeing[model] = freeing.get(model, 0.0) + m / FREEING_WINDOW
        return Rates(milli, count, freed, freeing)

    def rate(self, now: float) -> float | None:
        """Milli-GPUs served per second over the last ``DRAIN_WINDOW``, all models; None with too few starts."""
        got = self.rates(now)
        return got.of(None) if got is not None else None


@dataclass(frozen=True)
class Rates:
    """What :meth:`Drain.rates` measured: milli-GPUs served per second and starts, per model
    (``None``: starts whose model is not known, counted for waiters that take any model)."""

    milli: Mapping[str | None, float]
    starts: Mapping[str | None, int]
    #: milli-GPUs freed per second over the same time, per model (empty: not recorded)
    freed: Mapping[str, float] = field(default_factory=dict)
    #: milli-GPUs freed per second over the last ``FREEING_WINDOW``, per model (empty: not recorded)
    freeing: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def pooled(cls, milli_per_s: float) -> Rates:
        """One rate for the whole pool (models not told apart)."""
        return cls({None: milli_per_s}, {None: MIN_DRAIN_STARTS})

    def _sum(self, table: Mapping[str | None, Any], models: frozenset[str] | None) -> Any:
        if models is None or set(table) == {None}:
            return sum(table.values())
        return sum(v for k, v in table.items() if k is not None and k in models)

    def of(self, models: frozenset[str] | None) -> float | None:
        """The rate at which GPUs of ``models`` (None: any) were served; None with fewer than
        ``MIN_DRAIN_STARTS`` starts of them (the release model answers instead: never the
        whole pool's rate for one model, nor the typical session)."""
        if self._sum(self.starts, models) < MIN_DRAIN_STARTS:
            return None
        return self._sum(self.milli, models) or None

    def freeing_of(self, models: frozenset[str] | None) -> float | None:
        """Milli-GPUs of ``models`` (None: any) freed per second over the last ``FREEING_WINDOW``;
        None when none freed or frees are not recorded.

        Why: the starts of the last ``DRAIN_WINDOW`` average in the minutes before a burst
        filled the pool, when little went to waiters because few waited; once it is full,
        what frees is what the queue is handed. In the time replay's bursts (``default+gpuspec``
        at load 1.1, seed 42) waiters of one GPU were told twice their waits."""
        return self._sum(self.freeing, models) or None

    def used(self, models: frozenset[str] | None) -> float | None:
        """Of the GPU share of ``models`` freed lately, the part that went to waiters (what freed
        where no waiter fitted serves nobody: single GPUs scattered for a waiter of eight);
        None when none was freed or frees are not recorded."""
        freed = self._sum(self.freed, models)
        if freed <= 0:
            return None
        return min(1.0, self._sum(self.milli, models) / freed)

    def share(self, ahead: frozenset[str] | None, mine: frozenset[str] | None) -> float:
        """The part of a waiter ahead (accepting ``ahead``) that takes GPUs of ``mine``: of what
        waiters like it were served, the share that was of ``mine``'s models (all of it when
        ``ahead`` accepts only models ``mine`` accepts too)."""
        if mine is None or (ahead is not None and ahead <= mine):
            return 1.0
        both = mine if ahead is None else ahead & mine
        if not both:
            return 0.0
        total = self._sum(self.milli, ahead)
        if not total:
            return 1.0
        return min(1.0, self._sum(self.milli, both) / total)


class Arrivals:
    """Who joined the queue lately, per user: how often and asking how much GPU share.

    Why: the queue is round-robin across users. A user with fewer servers than a waiter's
    round who joins later goes ahead of it, so in a busy pool a waiter's need ahead grows
    while it waits (in the time replay, the waiters of a burst that waited 5 minutes or more
    saw more GPU share start after they joined, for waiters that joined after them, than for
    all those ahead of them when they joined)."""

    def __init__(self) -> None:
        # (seconds, user, GPU milli, whole GPUs of one node it waits for), oldest first
        self.joins: deque[tuple[float, str, int, int]] = deque()
        # per (user, size): the joins in ``joins`` and their GPU milli, kept as joins come and go (a
        # full pool's queue asks at every join: counting thousands of joins each time was a replay's
        # hot spot)
        self._count: dict[tuple[str, int], int] = {}
        self._milli: dict[tuple[str, int], int] = {}

    def add(self, at: float, user: str, milli: int, size: int = 1) -> None:
        """``user`` joined the queue at ``at`` asking for ``milli`` of GPU share, waiting for
        ``size`` whole GPUs of one node (1: one GPU or a share, :func:`.drains.node_gpus`)."""
        if milli > 0:
            key = (user, size)
            self.joins.append((at, user, milli, size))
            self._count[key] = self._count.get(key, 0) + 1
            self._milli[key] = self._milli.get(key, 0) + milli

    def rates(self, now: float, upto: int | None = None) -> dict[str, tuple[float, float]]:
        """Per user who joined within ``DRAIN_WINDOW`` (with ``upto``, asking for at most that many
        GPUs of one node): joins per second and GPU milli per join."""
        cut = now - DRAIN_WINDOW
        count, milli = self._count, self._milli
        while self.joins and self.joins[0][0] < cut:
            _, user, m, size = self.joins.popleft()
            key = (user, size)
            if count[key] == 1:
                del count[key], milli[key]
            else:
                count[key] -= 1
                milli[key] -= m
        if not self.joins:
            return {}
        span = max(now - max(cut, self.joins[0][0]), 1.0)
        n_of: dict[str, int] = {}
        m_of: dict[str, int] = {}
        for (u, size), n in count.items():
            if upto is None or size <= upto:
                n_of[u] = n_of.get(u, 0) + n
                m_of[u] = m_of.get(u, 0) + milli[(u, size)]
        return {u: (n / span, m_of[u] / n) for u, n in n_of.items()}


class Overtaking:
    """The GPU share that will join ahead of a waiter while it waits, as the fair order stands.

    A later waiter of user ``u`` sorts ahead of one in round ``r`` of its class when its own
    round is lower: ``u`` can put up to ``r`` minus its next round of servers ahead, at most
    as many as it joins in the time (its recent rate). Aging is left out: a young newcomer
    that sorts after an old waiter passes it once old itself, within ``RESERVE_AFTER``."""

    def __init__(self, order: FairOrder, arrivals: Mapping[str, tuple[float, float]],
                 running: Mapping[str, int],
                 sized: Callable[[int], Mapping[str, tuple[float, float]]] | None = None) -> None:
        """``order``: the fair order as sorted (its keys and each user's next round);
        ``arrivals``: :meth:`Arrivals.rates`; ``running``: servers held per user; ``sized``: the
        same for joins of at most so many GPUs of one node (``Arrivals.rates(now, upto)``).

        Why sizes: backfill starts a share or one GPU wherever it fits, so a user who joins
        asking for eight GPUs of one node does not take what a share waiter will get, however
        early its round; counted anyway, such joins made shares behind a queue of big waiters
        expect hours for a wait of seconds (the replay's ``default+multi``)."""
        self.order, self.arrivals, self.running, self.sized = order, arrivals, running, sized
        self._at: dict[str, int] | None = None
        self._one: tuple[str, int | None] | None = None  # the first waiter asked about and its place
        # per class and size: the joining users by the round of their next server (see _rounds)
        self._by_class: dict[tuple[int, int | None], list[_Round]] = {}

    def _rounds(self, klass: int, size: int | None = None) -> list[_Round]:
        """The joining users grouped by the round of their next server in ``klass``.

        Why: a full pool's queue can hold thousands of waiters, each asking about thousands
        of users who joined lately, at each step of the fixed point. Users of one round have
        the same room ahead of a waiter; sorted by how often they join, those who would join
        more than that room are a suffix, so a waiter's sum is a bisection per round."""
        got = self._by_class.get((klass, size))
        if got is None:
            nxt = self.order.next_round.get(klass, {})
            grouped: dict[int, list[tuple[float, float]]] = {}
            arrivals = self.arrivals if size is None or self.sized is None else self.sized(size)
            for user, (per_s, milli) in arrivals.items():
                grouped.setdefault(nxt.get(user, self.running.get(user, 0)), []).append((per_s, milli))
            got = self._by_class[(klass, size)] = sorted(_Round.of(r, users) for r, users in grouped.items())
        return got

    def _place(self, wid: str) -> int | None:
        """Where ``wid`` stands in the order (None: not in it). The first waiter asked about is
        found by a scan (a replay asks about one newcomer per order, a few times): the index
        of thousands of waiters is built only once a second one is asked about."""
        if self._at is None:
            if self._one is None or self._one[0] == wid:
                if self._one is None:
                    try:
                        self._one = (wid, list(map(_ID, self.order.waiters)).index(wid))
                    except ValueError:
                        self._one = (wid, None)
                return self._one[1]
            self._at = dict(zip(map(_ID, self.order.waiters), range(len(self.order.waiters))))
        return self._at.get(wid)

    def ahead(self, w: Waiter, seconds: float) -> float:
        """GPU milli expected to join ahead of ``w`` within ``seconds``."""
        if not self.arrivals or seconds <= 0:
            return 0.0
        i = self._place(w.id)
        if i is None:
            return 0.0
        klass, _, mine = self.order.keys[i]
        total = 0.0
        for group in self._rounds(klass, node_gpus(w) if self.sized is not None else None):
            room = mine - group.round
            if room <= 0:
                break  # sorted by round: no later group has room either
            total += group.within(room, seconds)
        return total  # its own user is never counted: their next round is past its own


@dataclass(frozen=True, order=True)
class _Round:
    """The joining users whose next server is in one round: join rates ascending, with running
    sums of GPU milli per join and of milli per second, for :meth:`Overtaking.ahead`."""

    round: int
    per_s: tuple[float, ...]
    milli_after: tuple[float, ...]  # sum of milli per join of users i.. (those from i on)
    flow_before: tuple[float, ...]  # sum of per_s * milli of users ..i (those before i)

    @classmethod
    def of(cls, round_: int, users: list[tuple[float, float]]) -> _Round:
        users.sort()
        milli_after = [0.0] * (len(users) + 1)
        for i in range(len(users) - 1, -1, -1):
            milli_after[i] = milli_after[i + 1] + users[i][1]
        flow_before = [0.0]
        for per_s, milli in users:
            flow_before.append(flow_before[-1] + per_s * milli)
        return cls(round_, tuple(p for p, _ in users), tuple(milli_after), tuple(flow_before))

    def within(self, room: int, seconds: float) -> float:
        """Of these users, the GPU milli that joins within ``seconds``, each at most ``room`` servers."""
        cut = bisect_left(self.per_s, room / seconds)  # from here on, a user fills its room
        return seconds * self.flow_before[cut] + room * self.milli_after[cut]
