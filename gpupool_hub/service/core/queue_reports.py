"""What the wait queue shows: ``GET queue``'s report, each user's waiting servers for
``GET me``, and the per-model summary the spawn form shows ("full — 2 waiting").

The queue (:class:`~gpupool_hub.service.core.queue.WaitQueue`) holds one
:class:`QueueReports`, apart so that the queue's rules of state (join, dispatch,
claim) read on their own; it only reads the entries, their order and the cached
estimates, and keeps its own summary a few seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ... import eta as eta_rules
from ...placement.request import Request, normalize_model
from ...timefmt import iso
from ...waitqueue import Waiter, fair_order
from .pool_inventory import PoolInventory
from .queue_entries import Entries
from .queue_eta import ESTIMATE_TTL, QueueEstimates, range_json
from .queue_order import FairQueueOrder
from .threads import CoreThreads, writes


class QueueReports:
    """The queue's read-side views (see the module docstring)."""

    def __init__(self, entries: Entries, order: FairQueueOrder, eta: QueueEstimates, inventory: PoolInventory,
                 clock: Callable[[], datetime], *, threads: CoreThreads | None = None) -> None:
        self.entries = entries
        self.order = order
        self.eta = eta
        self.inventory = inventory
        self.clock = clock
        self.threads = threads
        self._summary: tuple[float, dict[str, dict[str, Any]]] | None = None
        #: the pool map's rows and the entries' count, with what they were built from (``next_waiting``)
        self._next: tuple[tuple[Any, ...], list[dict[str, Any]], int] | None = None

    def waiting_per_model(self) -> dict[str, int]:
        """Per pool model, the waiters that would take it (not those whose GPUs are reserved:
        they start at their next ask): one that accepts several models (or any) counts under
        each of them, so the sum can pass the queue's length."""
        ordered = self.order.ordered()
        out = {}
        for model in sorted(self.inventory.models()):
            key = normalize_model(model)
            out[model] = sum(1 for w in ordered if w.request.models is None or key in w.request.models)
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per pool model: how many wait for it and when one more GPU of it is expected, also
        when nobody waits but none of it is free (a full profile shows an estimate before
        anyone waits for it)."""
        out: dict[str, dict[str, Any]] = {}
        free = self.eta.free_milli()
        for model, n in self.waiting_per_model().items():
            key = normalize_model(model)
            eta = est = None
            if n or free.get(key, 0) < 1000:
                probe = Waiter(id="?", user="", server="", request=Request(gpus=1, models=frozenset({key})),
                               since=self.clock(), priority=99)
                eta = self.eta.estimates(probe).get("?")
                est = self.eta.ranges(probe).get("?") or eta_rules.Estimate(eta, eta, eta, "fallback")
            out[model] = {"waiting": n, "eta": iso(eta), **range_json(est, self.clock())}
        return out

    @writes
    def cached_summary(self) -> dict[str, dict[str, Any]]:
        """``summary``, reused for a few seconds (every spawn form asks)."""
        stamp = self.clock().timestamp()
        if self._summary is None or stamp - self._summary[0] >= ESTIMATE_TTL:
            self._summary = (stamp, self.summary())
        return self._summary[1]

    @writes
    def report(self) -> dict[str, Any]:
        """The admin view: who waits for what, since when, position and estimate."""
        estimates = self.eta.estimates()
        rows = self._rows(None, estimates, lambda w: self.eta.range_of(w.id, estimates.get(w.id)))
        reserved = self.order.reservation
        return {"waiting": rows, "length": self.order.waiting_count(),
                "reserved_node": reserved[1] if reserved else None, "accuracy": self.eta.accuracy()}

    @writes
    def next_waiting(self, first: int) -> tuple[list[dict[str, Any]], int]:
        """The pool map's rows: the first ``first`` entries in ``report``'s order, and how many
        entries there are. Built once per change of the entries, their order or the estimates,
        never for the thousands the page does not draw, and from the estimates last computed
        (the waiters' retries recompute them every ``ESTIMATE_TTL``; a page view does not): at
        2,000 waiters the whole report took most of the pool page's time (issue 48.10)."""
        estimates, ranges = self.eta.last_estimates(), self.eta.last_ranges()
        if not estimates and len(self.entries):  # none computed yet (a service just started)
            estimates, ranges = self.eta.estimates(), self.eta.ranges()
        key = (self.entries.version, self.order.ordered(), estimates, ranges, first)
        kept = self._next
        if kept is not None and kept[0][0] == key[0] and all(a is b for a, b in zip(kept[0][1:4], key[1:4])) \
                and kept[0][4] == first:
            return kept[1], kept[2]
        rows = self._rows(first, estimates, lambda w: self.eta.last_shown(w.id) or ranges.get(w.id) or (
            eta_rules.Estimate(*[estimates.get(w.id)] * 3, "fallback") if w.id in estimates else None))
        self._next = (key, rows, len(self.entries))
        return rows, len(self.entries)

    def _rows(self, first: int | None, estimates: dict[str, datetime | None],
              shown: Callable[[Waiter], eta_rules.Estimate | None]) -> list[dict[str, Any]]:
        """``report``'s rows, the next to start first (entries whose GPUs are reserved lead), each
        waiter's range from ``shown``; only the first ``first`` of them are built."""
        now = self.clock()
        place = {w.id: i for i, w in enumerate(self.order.ordered(), 1)}
        entries = sorted(self.entries.values(), key=lambda e: (place.get(e.waiter.id, 0), e.waiter.since))
        rows = []
        for e in entries if first is None else entries[:first]:
            w = e.waiter
            rows.append({"user": w.user, "server": w.server, "request": w.request.describe(),
                         "since": iso(w.since), "waited_seconds": int((now - w.since).total_seconds()),
                         "position": place.get(w.id, 0), "priority": "under_quota" if w.priority == 0 else "fcfs",
                         "eta": iso(estimates.get(w.id)), "reserved_on": e.placement.node if e.placement else None,
                         "last_seen": iso(e.last_seen), **range_json(None if e.placement else shown(w), now)})
        return rows

    def waiting_of(self, user: str) -> list[dict[str, Any]]:
        """``GET me``'s ``waiting``: the user's waiting servers with position and the last
        computed estimate. Called off the writer thread, so it reads a snapshot of the
        entries and never recomputes estimates (the spawner's retries keep them fresh)."""
        if not self.entries.has_user(user):
            return []
        entries = list(self.entries.values())  # one atomic copy: the writer may change the dict
        mine = [e for e in entries if e.waiter.user == user]
        if not mine:
            return []
        order = [w.id for w in fair_order((e.waiter for e in entries if e.placement is None), self.order.head(),
                                          self.order.running(entries), now=self.clock())]
        estimates = self.eta.last_estimates()
        ranges = self.eta.last_ranges()
        now = self.clock()
        # the GPU part of the description ("2 GPUs (rtx 3090)"): what the widget shows
        return [{"server": e.waiter.server, "request": e.waiter.request.describe().partition(", ")[0],
                 "since": iso(e.waiter.since),
                 "position": order.index(e.waiter.id) + 1 if e.waiter.id in order else 0,
                 "queue_length": len(order), "eta": iso(estimates.get(e.waiter.id)),
                 # what its progress page was last told (held steady), else the last computed
                 **range_json(self.eta.last_shown(e.waiter.id) or ranges.get(e.waiter.id) or (
                     eta_rules.Estimate(*[estimates.get(e.waiter.id)] * 3, "fallback")
                     if e.waiter.id in estimates else None), now)}
                for e in sorted(mine, key=lambda e: e.waiter.since)]
