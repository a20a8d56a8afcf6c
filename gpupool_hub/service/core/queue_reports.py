"""What the wait queue shows: ``GET queue``'s report, each user's waiting servers for
``GET me``, and the per-model summary the spawn form shows ("full — 2 waiting").

The queue (:class:`~gpupool_hub.service.core.queue.WaitQueue`) holds one
:class:`QueueReports`, apart so that the queue's rules of state (join, dispatch,
claim) read on their own; it only reads the entries, their order and the cached
estimates, and keeps its own summary a few seconds.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...queue import estimates as eta_rules
from ...placement.request import Request, normalize_model
from ...timefmt import iso
from ...queue.order import Waiter, fair_order
from .pool_inventory import PoolInventory
from .queue_entries import Entries, WaitingServer
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
        rows, _ = self.first_waiting(None)
        return {"waiting": rows, "length": self.order.waiting_count(), **self.held_nodes(),
                "accuracy": self.eta.accuracy()}

    @writes
    def held_nodes(self) -> dict[str, Any]:
        """The nodes whose free GPUs not every waiter may take: held for the head of the queue,
        drained for waiters of several GPUs, kept whole for profiles of several GPUs. The pool
        map shows their free GPUs as free; this says why a waiter does not get them."""
        reserved = self.order.reservation
        return {"reserved_node": reserved[1] if reserved else None, "drained_nodes": sorted(self.order.drained),
                "kept_nodes": self.inventory.pool.kept_nodes()}

    @writes
    def first_waiting(self, count: int | None) -> tuple[list[dict[str, Any]], int]:
        """The first ``count`` rows (all, with None) of ``report``'s ``waiting``, in its order
        (those with GPUs reserved, then the queue's order), and how many entries there are.

        The admin pool map shows the head of a queue of thousands, on every render: a row
        costs its waiter's estimate range, so the rows it does not show are not built (2,000
        of them took 0.25–3 s of the writer thread). Nothing is kept between calls, so the
        next render shows every join, start and release."""
        now = self.clock()
        estimates = self.eta.estimates()
        place = {w.id: i for i, w in enumerate(self.order.ordered(), 1)}
        entries = list(self.entries.values())  # one copy, sorted, or only the first few picked

        def key(e: WaitingServer) -> tuple[int, datetime]:
            return place.get(e.waiter.id, 0), e.waiter.since

        first = sorted(entries, key=key) if count is None else heapq.nsmallest(count, entries, key=key)
        rows = []
        for e in first:
            w = e.waiter
            rows.append({"user": w.user, "server": w.server, "request": w.request.describe(),
                         "since": iso(w.since), "waited_seconds": int((now - w.since).total_seconds()),
                         "position": place.get(w.id, 0), "priority": "under_quota" if w.priority == 0 else "fcfs",
                         "eta": iso(estimates.get(w.id)), "reserved_on": e.placement.node if e.placement else None,
                         "last_seen": iso(e.last_seen), **range_json(
                             None if e.placement else self.eta.range_of(w.id, estimates.get(w.id)), now)})
        return rows, len(entries)

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
