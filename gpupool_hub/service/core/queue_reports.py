"""What the wait queue shows: ``GET queue``'s report, each user's waiting servers for
``GET me``, and the per-model summary the spawn form shows ("full — 2 waiting").

A base of :class:`~gpupool_hub.service.core.queue.WaitQueue`, apart so that the
queue's rules of state (join, dispatch, claim) read on their own; these only read
its state and its cached estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from ... import eta as eta_rules
from ...placement.request import Request, normalize_model
from ...timefmt import iso
from ...waitqueue import Waiter, fair_order
from .inventory import PoolInventory
from .queue_eta import ESTIMATE_TTL
from .threads import CoreThreads, writes


class QueueReports:
    """The queue's read-side views (see the module docstring)."""

    entries: Any  # queue.Entries
    inventory: PoolInventory
    clock: Callable[[], datetime]
    threads: CoreThreads | None
    reservation: tuple[str, str] | None
    _estimates: tuple[float, dict[str, datetime | None]] | None
    _ranges: tuple[float, dict[str, eta_rules.Estimate]] | None
    _summary: tuple[float, dict[str, dict[str, Any]]] | None

    # provided by WaitQueue and QueueRanges
    def ordered(self) -> list[Waiter]:
        raise NotImplementedError("Subclass must provide implementation")

    def estimates(self, extra: Waiter | None = None) -> dict[str, datetime | None]:
        raise NotImplementedError("Subclass must provide implementation")

    def ranges(self, extra: Waiter | None = None, only: str | None = None) -> dict[str, eta_rules.Estimate]:
        raise NotImplementedError("Subclass must provide implementation")

    def range_of(self, entry_id: str, eta: datetime | None) -> eta_rules.Estimate:
        raise NotImplementedError("Subclass must provide implementation")

    def waiting_count(self) -> int:
        raise NotImplementedError("Subclass must provide implementation")

    def accuracy(self) -> dict[str, Any]:
        raise NotImplementedError("Subclass must provide implementation")

    def _head(self) -> str | None:
        raise NotImplementedError("Subclass must provide implementation")

    def _running(self, entries: Iterable[Any]) -> dict[str, int]:
        raise NotImplementedError("Subclass must provide implementation")

    @staticmethod
    def _range_json(est: eta_rules.Estimate | None, now: datetime) -> dict[str, Any]:
        raise NotImplementedError("Subclass must provide implementation")

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per pool model: how many wait for it and when one more GPU of it is expected."""
        ordered = self.ordered()
        out: dict[str, dict[str, Any]] = {}
        for model in sorted(self.inventory.models()):
            key = normalize_model(model)
            n = sum(1 for w in ordered if w.request.models is None or key in w.request.models)
            eta = est = None
            if n:
                probe = Waiter(id="?", user="", server="", request=Request(gpus=1, models=frozenset({key})),
                               since=self.clock(), priority=99)
                eta = self.estimates(probe).get("?")
                est = self.ranges(probe).get("?") or eta_rules.Estimate(eta, eta, eta, "fallback")
            out[model] = {"waiting": n, "eta": iso(eta), **self._range_json(est, self.clock())}
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
        now = self.clock()
        estimates = self.estimates()
        place = {w.id: i for i, w in enumerate(self.ordered(), 1)}
        rows = []
        for e in sorted(self.entries.values(), key=lambda e: (place.get(e.waiter.id, 0), e.waiter.since)):
            w = e.waiter
            rows.append({"user": w.user, "server": w.server, "request": w.request.describe(),
                         "since": iso(w.since), "waited_seconds": int((now - w.since).total_seconds()),
                         "position": place.get(w.id, 0), "priority": "under_quota" if w.priority == 0 else "fcfs",
                         "eta": iso(estimates.get(w.id)), "reserved_on": e.placement.node if e.placement else None,
                         "last_seen": iso(e.last_seen), **self._range_json(
                             None if e.placement else self.range_of(w.id, estimates.get(w.id)), now)})
        return {"waiting": rows, "length": self.waiting_count(),
                "reserved_node": self.reservation[1] if self.reservation else None, "accuracy": self.accuracy()}

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
        order = [w.id for w in fair_order((e.waiter for e in entries if e.placement is None), self._head(),
                                          self._running(entries), now=self.clock())]
        cached = self._estimates
        estimates = cached[1] if cached is not None else {}
        ranged = self._ranges  # one read, as for the estimates
        ranges = ranged[1] if ranged is not None else {}
        now = self.clock()
        # the GPU part of the description ("2 GPUs (rtx 3090)"): what the widget shows
        return [{"server": e.waiter.server, "request": e.waiter.request.describe().partition(", ")[0],
                 "since": iso(e.waiter.since),
                 "position": order.index(e.waiter.id) + 1 if e.waiter.id in order else 0,
                 "queue_length": len(order), "eta": iso(estimates.get(e.waiter.id)),
                 **self._range_json(ranges.get(e.waiter.id) or (
                     eta_rules.Estimate(*[estimates.get(e.waiter.id)] * 3, "fallback")
                     if e.waiter.id in estimates else None), now)}
                for e in sorted(mine, key=lambda e: e.waiter.since)]
