"""The wait queue's fair order and each waiter's place, kept between changes.

The queue (:class:`~gpupool_hub.service.core.queue.WaitQueue`) holds one
:class:`FairQueueOrder`. The order's rules are pure
(:class:`~gpupool_hub.queue.order.FairOrder`); this keeps what they are sorted
from besides the entries (the reserved head, each user's held servers, the
placements given) and the last order with what it was sorted from, because
every waiting spawner asks for its place every few seconds (about 200 asks a
second at 2,000 waiters) and between most asks nothing changed. It is valid
while the entries, the placements given, the held servers and the head are
those it was sorted from, and until the first young waiter turns old; a
newcomer joining behind everyone is put into it (``FairOrder.behind``) instead
of sorting again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from ...queue.order import FairOrder, Waiter
from .queue_entries import Entries, WaitingServer

#: what an order was sorted from: (entries' version, placements given, held servers, head)
Basis = tuple[int, int, dict[str, int], "str | None"]
#: the kept order: its basis, when it was sorted, the order, each id's place once asked
Kept = tuple[Basis, datetime, FairOrder, "dict[str, int] | None"]


class FairQueueOrder:
    """The fair order of the queue's entries and their positions (see the module docstring).
    It reads the entries; the queue tells it of the rest (``reserve``, ``count_held``,
    ``claimed``, ``moved``, ``keep``), on its writer thread."""

    def __init__(self, entries: Entries, clock: Callable[[], datetime]) -> None:
        self.entries = entries
        self.clock = clock
        self.reservation: tuple[str, str] | None = None  # (head entry id, node held for it)
        self.drained: frozenset[str] = frozenset()  # nodes drained for old waiters of several GPUs
        # GPU servers each user holds (ledger allocations), counted at each dispatch: a user's
        # running servers take earlier rounds of the round-robin order (queue.order.fair_order)
        self.held_by_user: dict[str, int] = {}
        self._placements = 0  # counts placements given, after they are given
        self._kept: Kept | None = None

    # ------------------------------------------------ what the queue tells it

    def reserve(self, reservation: tuple[str, str] | None, drained: frozenset[str] = frozenset()) -> None:
        """Dispatch's reservation (its entry is the head, first in the order) and the nodes it
        drains for old waiters of several GPUs, for the next pass."""
        self.reservation = reservation
        self.drained = drained

    def count_held(self, held_by_user: dict[str, int]) -> None:
        """The GPU servers each user holds, as the ledger counts them (at each dispatch)."""
        self.held_by_user = held_by_user

    def claimed(self, user: str) -> None:
        """A waiter of ``user`` took its GPUs: held from here on (a new dict: readers copy it)."""
        self.held_by_user = {**self.held_by_user, user: self.held_by_user.get(user, 0) + 1}

    def moved(self) -> None:
        """Dispatch placed waiters: GPUs moved, the order changes."""
        self._placements += 1

    def keep(self, order: FairOrder, at: datetime) -> None:
        """A full pass sorted the waiters as they stand (none placed, none expired): keep it."""
        self._kept = (self._basis(), at, order, None)

    # --------------------------------------------------------------- answers

    def head(self) -> str | None:
        """The entry id holding the reserved node (it stays first, see ``fair_order``)."""
        held = self.reservation  # one read: the writer thread may replace it
        return held[0] if held is not None else None

    def running(self, entries: Iterable[WaitingServer], only: str | None = None) -> dict[str, int]:
        """GPU servers per user ahead of their waiters: held ones and those with reserved GPUs.
        With ``only``, that user's alone (a newcomer's: no copy of 5,000 holders per join)."""
        out = dict(self.held_by_user) if only is None else {only: self.held_by_user.get(only, 0)}
        for e in entries:
            if e.placement is not None and (only is None or e.waiter.user == only):
                out[e.waiter.user] = out.get(e.waiter.user, 0) + 1
        return out

    def waiting_count(self) -> int:
        """How many wait (not yet placed): ``len(ordered())`` without sorting them."""
        kept = self.kept(self.clock())  # every spawn asks: 2,000 waiters need not be counted
        if kept is not None:
            return len(kept[2].waiters)
        return sum(1 for e in self.entries.values() if e.placement is None)

    def ordered(self) -> list[Waiter]:
        return self._fair_order()[2].waiters

    def fair(self) -> FairOrder:
        """The fair order with what it was sorted by (each waiter's round, each user's next)."""
        return self._fair_order()[2]

    def position(self, entry: WaitingServer) -> int:
        if entry.placement is not None:
            return 0
        basis, at, order, places = self._fair_order()
        if places is None:
            places = {w.id: i for i, w in enumerate(order.waiters, 1)}
            self._kept = (basis, at, order, places)
        return places[entry.waiter.id]

    def _basis(self) -> Basis:
        """What the fair order is sorted from, read before sorting: the entries' version, the
        placements given, the held servers (a new dict at each change) and the head."""
        return self.entries.version, self._placements, self.held_by_user, self.head()

    def kept(self, now: datetime) -> Kept | None:
        """The kept order if nothing it was sorted from changed and no waiter turned old since."""
        cached = self._kept
        if cached is None:
            return None
        (version, placements, held, head), at, order, _ = cached
        current = self._basis()
        if (version, placements, head) != (current[0], current[1], current[3]) or held is not current[2]:
            return None
        if now < at or (order.until is not None and now >= order.until):
            return None
        return cached

    def _fair_order(self) -> Kept:
        now = self.clock()
        cached = self.kept(now)
        if cached is None:
            basis = self._basis()  # before the entries are read: a change meanwhile outdates it
            entries = list(self.entries.values())
            order = FairOrder.of((e.waiter for e in entries if e.placement is None), basis[3],
                                 self.running(entries), now=now)
            cached = self._kept = (basis, now, order, None)
        return cached

    def put_behind(self, before: Kept | None, w: Waiter) -> None:
        """Put a newcomer that joined behind everyone into ``before``, the order kept before it
        joined (no re-sort); without one, the next ask sorts."""
        if before is None:
            return
        order = before[2].behind(w, self.running(self.entries.values(), only=w.user))
        if order is not None:
            self._kept = (self._basis(), before[1], order, None)
