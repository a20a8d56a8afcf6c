"""The wait queue's fair order and each waiter's place, kept between changes.

A base of :class:`~gpupool_hub.service.core.queue.WaitQueue`, apart so that each
stays readable. The order's rules are pure (:class:`~gpupool_hub.waitqueue.FairOrder`);
this keeps the last order with what it was sorted from, because every waiting
spawner asks for its place every few seconds (about 200 asks a second at 2,000
waiters) and between most asks nothing changed. It is valid while the entries,
the placements given, the held servers and the head are those it was sorted
from, and until the first young waiter turns old; a newcomer joining behind
everyone is put into it (``FairOrder.behind``) instead of sorting again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from ...waitqueue import FairOrder, Waiter

if TYPE_CHECKING:
    from .queue import Entries, Entry

#: what an order was sorted from: (entries' version, placements given, held servers, head)
Basis = tuple[int, int, dict[str, int], "str | None"]
#: the kept order: its basis, when it was sorted, the order, each id's place once asked
Kept = tuple[Basis, datetime, FairOrder, "dict[str, int] | None"]


class QueueOrder:
    """The fair order and positions (see the module docstring)."""

    entries: Entries
    clock: Callable[[], datetime]
    reservation: tuple[str, str] | None
    held_by_user: dict[str, int]
    _placements: int
    _order: Kept | None

    def _head(self) -> str | None:
        """The entry id holding the reserved node (it stays first, see ``fair_order``)."""
        held = self.reservation  # one read: the writer thread may replace it
        return held[0] if held is not None else None

    def _running(self, entries: Iterable[Entry], only: str | None = None) -> dict[str, int]:
        """GPU servers per user ahead of their waiters: held ones and those with reserved GPUs.
        With ``only``, that user's alone (a newcomer's: no copy of 5,000 holders per join)."""
        out = dict(self.held_by_user) if only is None else {only: self.held_by_user.get(only, 0)}
        for e in entries:
            if e.placement is not None and (only is None or e.waiter.user == only):
                out[e.waiter.user] = out.get(e.waiter.user, 0) + 1
        return out

    def waiting_count(self) -> int:
        """How many wait (not yet placed): ``len(ordered())`` without sorting them."""
        kept = self._valid_order(self.clock())  # every spawn asks: 2,000 waiters need not be counted
        if kept is not None:
            return len(kept[2].waiters)
        return sum(1 for e in self.entries.values() if e.placement is None)

    def ordered(self) -> list[Waiter]:
        return self._fair_order()[2].waiters

    def position(self, entry: Entry) -> int:
        if entry.placement is not None:
            return 0
        basis, at, order, places = self._fair_order()
        if places is None:
            places = {w.id: i for i, w in enumerate(order.waiters, 1)}
            self._order = (basis, at, order, places)
        return places[entry.waiter.id]

    def _basis(self) -> Basis:
        """What the fair order is sorted from, read before sorting: the entries' version, the
        placements given, the held servers (a new dict at each change) and the head."""
        return self.entries.version, self._placements, self.held_by_user, self._head()

    def _valid_order(self, now: datetime) -> Kept | None:
        """The cached order if nothing it was sorted from changed and no waiter turned old since."""
        cached = self._order
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
        cached = self._valid_order(now)
        if cached is None:
            basis = self._basis()  # before the entries are read: a change meanwhile outdates it
            entries = list(self.entries.values())
            order = FairOrder.of((e.waiter for e in entries if e.placement is None), basis[3],
                                 self._running(entries), now=now)
            cached = self._order = (basis, now, order, None)
        return cached

    def _order_behind(self, before: Kept | None, w: Waiter) -> None:
        """Put a newcomer that joined behind everyone into the cached order (no re-sort)."""
        if before is None:
            return
        order = before[2].behind(w, self._running(self.entries.values(), only=w.user))
        if order is not None:
            self._order = (self._basis(), before[1], order, None)
