"""The wait queue in the service: servers waiting for GPUs, in fair order.

The rules are pure (:mod:`gpupool_hub.queue`); this unit keeps their
state. A GPU request that finds no room joins the queue (one entry per (user,
server)) and is refused with ``QUEUED``, its position and an estimate; the
spawner retries every few seconds, and each retry answers the current
position. Whenever GPUs are released, :meth:`WaitQueue.dispatch` places
waiters in fair order; a placed waiter's GPUs are reserved in the pool under
the entry's id, and its next retry claims them (admission records the
allocation). While anyone waits, new arrivals join the queue too and start at
once only where dispatch's backfill rule lets them.

Entries are stored in the ledger database (``gpupool_queue``), so a restart
loses nobody's place; reservations are made again by the first dispatch.
A user holds at most ``max_waiting_per_user`` entries: a spawn past that is
refused at once (``QUEUE_LIMIT``), so nobody fills the queue, and the rules'
round-robin order puts a user's second entry after everyone else's first.
An entry ends when it is claimed, when its spawner stops retrying
(``queue_poll_timeout``), when the spawn is cancelled (``leave``), and after
``max_wait``.

The queue is the only one to change its entries, and it holds the three parts that
answer from them, each the only one to change its own state: the fair order and each
waiter's place (``order``, :mod:`.queue_order`), the estimates (``eta``,
:mod:`.queue_eta`) and what the queue shows (``reports``, :mod:`.queue_reports`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from ...queue import estimates as eta_rules
from ...config import GPUPool
from ...ledger import Ledger
from ...placement.request import Request, model_allowed, normalize_model, same_request
from ...placement.state import Placement
from ...reasons import RefusalReason
from ...timefmt import iso
from ...queue.order import BORROWER, FairOrder, Waiter
from ...queue.dispatch import Dispatch, dispatch, join_behind
from ...queue.drains import node_gpus
from ...queue.pressure import demand
from ...queue.starts import wait_place, wait_text
from .errors import Refused
from .pool_inventory import PoolInventory
from .queue_entries import Entries, WaitingServer
from .queue_eta import KnownEnds, QueueEstimates, range_json
from .queue_order import FairQueueOrder
from .queue_reports import QueueReports
from .reclaims import Reclaims
from .threads import CoreThreads, writes
from ...queue.shown import range_text, source_note

log = logging.getLogger("gpupool.queue")


def _request_json(req: Request) -> dict[str, Any]:
    return {"cpu_milli": req.cpu_milli, "memory_mib": req.memory_mib, "gpus": req.gpus,
            "gpu_milli": req.gpu_milli, "models": sorted(req.models) if req.models is not None else None,
            **({"mig": req.mig} if req.mig else {})}


def _request(data: dict[str, Any]) -> Request:
    models = data.get("models")
    return Request(cpu_milli=data["cpu_milli"], memory_mib=data["memory_mib"], gpus=data["gpus"],
                   gpu_milli=data["gpu_milli"], models=frozenset(models) if models is not None else None,
                   mig=data.get("mig"))


class WaitQueue:
    """Waiting servers: join, dispatch, claim, leave, expire; their answers. It holds its
    fair order (``order``), its estimates (``eta``) and what it shows (``reports``)."""

    def __init__(self, settings: GPUPool, ledger: Ledger, inventory: PoolInventory, reclaims: Reclaims,
                 clock: Callable[[], datetime], *, known_ends: KnownEnds | None = None,
                 threads: CoreThreads | None = None) -> None:
        """``known_ends``: when held allocations are expected to end, beyond the defaults
        (the idle reclaim deadlines)."""
        self.settings = settings
        self.ledger = ledger
        self.inventory = inventory
        self.clock = clock
        self.threads = threads
        self.entries = Entries()
        # the fair order of the waiting entries and each one's place, kept between changes:
        # every waiting spawner asks for its place every few seconds, and nothing changes
        # between most of those asks
        self.order = FairQueueOrder(self.entries, clock)
        self.eta = QueueEstimates(settings, ledger, inventory, reclaims, self.order, clock,
                                  known_ends=known_ends, threads=threads)
        self.reports = QueueReports(self.entries, self.order, self.eta, inventory, clock, threads=threads)
        # (user, server) whose place was given up by a cancel: their spawner's next retry ends
        self.cancelled: dict[tuple[str, str], tuple[datetime, Request, list[str] | None]] = {}
        self._shown: set[str] = set()  # entry ids whose shown estimate is recorded
        # after a full dispatch that left a head waiting: (the pool, its release count, the head's
        # entry, the pass); while the first three still hold and no waiter became old since (the
        # pass's ``until``), a newcomer needs no full pass (``join_behind``)
        self._settled: tuple[Any, int, WaitingServer, Dispatch] | None = None
        self._expiry_due: datetime | None = None  # no entry expires before this (``expire``)
        self.on_started: Callable[[float], None] | None = None  # see ``report_to``

    def report_to(self, on_started: Callable[[float], None]) -> None:
        """Hand the seconds each waiter waited, as its GPUs are claimed, to ``on_started``
        (the service's /metrics keeps a histogram of waits)."""
        self.on_started = on_started

    @property
    def pool(self) -> Any:
        return self.inventory.pool

    def enabled_for(self, req: Request) -> bool:
        return bool(self.settings.queue_enabled and req.total_gpu_milli)

    # ------------------------------------------------------------ lifecycle

    def restore(self) -> int:
        """At start-up: the stored entries, as if each had just retried; then a dispatch."""
        now = self.clock()
        for row in self.ledger.queue.rows():
            w = Waiter(id=row["id"], user=row["user"], server=row["server"], request=_request(row["request"]),
                       since=row["since"], priority=row["priority"])
            self.entries[(w.user, w.server)] = WaitingServer(w, row["requested_models"], now)
        self.dispatch()
        return len(self.entries)

    def could_fit(self, req: Request) -> bool:
        """Whether some node could ever take ``req`` (else it must not wait)."""
        return self.pool.could_ever_fit(req)

    def pending(self, user: str, server: str) -> WaitingServer | None:
        return self.entries.get((user, server))

    def join(self, user: str, server: str, req: Request, requested_models: list[str] | None,
             priority: int = BORROWER) -> tuple[str, Placement]:
        """Queue (user, server) behind everyone waiting, then dispatch: its (id, placement)
        if backfill lets it start now, else ``Refused(QUEUED)`` with its position."""
        self.check_limit(user, server)
        now = self.clock()
        w = Waiter(id=uuid.uuid4().hex, user=user, server=server, request=req, since=now,
                   priority=priority)
        row = {"id": w.id, "user": user, "server": server, "request": _request_json(req),
               "requested_models": requested_models, "priority": priority, "since": now}
        entry = WaitingServer(w, requested_models, now)
        before = self.order.kept(now)
        self.entries[entry.key] = entry
        try:
            settled = self._settled_pass(now)
            if settled is not None and self.order.reservation is not None and w.priority >= settled[0].waiter.priority:
                # what a full pass would do: start it off the head's node and those old waiters closed
                entry.placement = join_behind(self.pool, w, settled[1].closed_to(w.priority))
                if entry.placement is None:
                    self.order.put_behind(before, w)
            else:
                self.dispatch()
            if entry.placement is not None:  # backfilled at once: it never waited, nothing to store
                return self.claim(entry, stored=False)
            refused, shown = self._refusal(entry)
            # the entry and the estimate it was shown, in one transaction (one commit per join)
            self.ledger.queue.add(row, shown=shown)
            self._shown.add(w.id)
            self.eta.joined(now, user, req.total_gpu_milli, node_gpus(w))
        except BaseException:  # nothing stored: the queue in memory forgets it too
            if self.entries.get(entry.key) is entry:
                self.entries.pop(entry.key)
                self._settled = None
            if entry.placement is not None and w.id in self.pool:
                self.pool.release(w.id)
            raise
        log.info("%s/%s queued for %s (%d waiting)", user, server or "-", req.describe(), len(self.entries))
        raise refused

    def check_limit(self, user: str, server: str) -> None:
        """``Refused(QUEUE_LIMIT)`` when ``user`` already holds ``max_waiting_per_user`` places
        (for other servers): refused at once, never queued, naming the servers that wait."""
        if not self.entries.has_user(user):
            return
        mine = sorted((e for e in self.entries.values() if e.waiter.user == user and e.waiter.server != server),
                      key=lambda e: e.waiter.since)
        limit = self.settings.max_waiting_per_user
        if len(mine) < limit:
            return
        places = [(e.waiter.server, self.order.position(e)) for e in mine]
        listed = ", ".join(f"{server or 'default'!r} ({wait_place(p)})" for server, p in places)
        noun = "server" if len(mine) == 1 else "servers"
        raise Refused(RefusalReason.QUEUE_LIMIT,
                      f"You already wait for {len(mine)} {noun}: {listed}. Each user may wait for at most {limit} "
                      "at a time; stop one of them, or start this one once one of them has started.",
                      details={"max_waiting_per_user": limit,
                               "waiting": [{"server": server, "position": p} for server, p in places]})

    def poll(self, entry: WaitingServer, req: Request, requested_models: list[str] | None) -> tuple[str, Placement] | None:
        """A retry of a queued (user, server): its reservation if dispatch placed it, else
        ``Refused(QUEUED)``. A changed request (another size or model) gives up the old place
        and its reserved GPUs (None: ask anew)."""
        if not same_request(entry.waiter.request, entry.requested_models, req, requested_models):
            self.remove(entry, "the request changed")
            return None
        entry.last_seen = self.clock()
        if entry.expired:
            self.remove(entry, "waited longer than max_wait")
            raise Refused(RefusalReason.NO_CAPACITY,
                          f"No GPU became free for {req.describe()} within {self.settings.max_wait / 60:g} minutes "
                          "of waiting; try again later or pick a smaller profile.",
                          details={"waited_seconds": int((self.clock() - entry.waiter.since).total_seconds())})
        if entry.placement is not None:
            return self.claim(entry)
        raise self.refusal(entry)

    def claim(self, entry: WaitingServer, stored: bool = True) -> tuple[str, Placement]:
        """Hand the reserved GPUs over (admission records them under the entry's id);
        ``stored``: the entry is in the ledger (it waited), else it started as it joined."""
        assert entry.placement is not None
        self.entries.pop(entry.key, None)
        if stored:
            self.ledger.queue.remove(entry.waiter.id)
            self.ledger.queue.estimate_started(entry.waiter.id, self.clock())
            gpus = entry.placement.gpus
            self.eta.started(self.clock(), entry.waiter.request.total_gpu_milli, gpus[0].model if gpus else None)
            if self.on_started is not None:
                self.on_started((self.clock() - entry.waiter.since).total_seconds())
        self._shown.discard(entry.waiter.id)
        self.order.claimed(entry.waiter.user)  # admission records it now: held from here on
        return entry.waiter.id, entry.placement

    def freed(self, at: datetime, gpus: Iterable[dict[str, Any]]) -> None:
        """A held allocation's GPUs went back to the pool (the estimates weigh what frees
        against what the queue is served)."""
        self.eta.freed(at, gpus)

    def remove(self, entry: WaitingServer, why: str) -> None:
        """Drop an entry, giving its reserved GPUs back (and to the next waiters)."""
        self.entries.pop(entry.key, None)
        self._settled = None  # it may have been the head
        self.ledger.queue.remove(entry.waiter.id)
        log.info("%s/%s left the queue: %s", entry.waiter.user, entry.waiter.server or "-", why)
        if entry.placement is not None:
            if entry.waiter.id in self.pool:
                self.pool.release(entry.waiter.id)
            self.dispatch()

    @writes
    def leave(self, user: str, server: str) -> bool:
        """The spawn was cancelled: give up the place. False when (user, server) did not wait."""
        entry = self.entries.get((user, server))
        if entry is None:
            return False
        self.cancelled[(user, server)] = (self.clock(), entry.waiter.request, entry.requested_models)
        self.remove(entry, "cancelled")
        return True

    def check_cancelled(self, user: str, server: str, req: Request, requested_models: list[str] | None) -> None:
        """A retry from a spawn whose place was given up (``leave``) ends it, once. A request for
        something else (another model) is a new spawn of the server, never the cancelled one."""
        gone = self.cancelled.pop((user, server), None)
        if gone is None or not same_request(gone[1], gone[2], req, requested_models):
            return
        at = gone[0]
        if (self.clock() - at).total_seconds() <= self.settings.queue_poll_timeout:
            raise Refused(RefusalReason.NO_CAPACITY,
                          "Your place in the GPU queue was given up (the spawn was cancelled); "
                          "start the server again to queue anew.", details={"cancelled_at": iso(at)})

    @writes
    def housekeeping(self) -> None:
        """The queue job's run: drop entries whose spawner stopped asking, and dispatch after
        releases that did not go through admission (a reclaim's victims, a lapsed reservation)."""
        if self.entries:
            self.expire()
            self.dispatch()

    def expire(self) -> int:
        """Drop entries whose spawner stopped asking; mark those past ``max_wait``."""
        now = self.clock()
        # every admission asks first, and 2,000 waiters are 2,000 checks: none is made before the
        # earliest time the last look found (a retry, a newcomer or a placement only puts it later)
        if self._expiry_due is not None and now < self._expiry_due:
            return 0
        poll_timeout = timedelta(seconds=self.settings.queue_poll_timeout)
        max_wait = timedelta(seconds=self.settings.max_wait)
        unseen_before, too_old = now - poll_timeout, now - max_wait
        gone, due = 0, None
        for entry in list(self.entries.values()):
            if entry.last_seen < unseen_before:
                self.remove(entry, "no retry from its spawner (left or cancelled)")
                gone += 1
                continue
            if entry.waiter.since < too_old and entry.placement is None and not entry.expired:
                entry.expired = True
                self._settled = None  # an expired head gives its node up at the next pass
            at = entry.last_seen + poll_timeout
            if entry.placement is None and not entry.expired:
                at = min(at, entry.waiter.since + max_wait)
            due = at if due is None else min(due, at)
        self._expiry_due = due
        return gone

    def dispatch(self) -> list[WaitingServer]:
        """GPUs were released: place waiters in fair order (see :func:`queue.dispatch.dispatch`)."""
        self._settled = None
        self._expiry_due = None  # placements may change: the next expire looks at every entry
        waiting = [e for e in self.entries.values() if e.placement is None and not e.expired]
        if not waiting:
            self.order.reserve(None)
            return []
        by_id = {e.waiter.id: e for e in waiting}
        self.order.count_held(self.ledger.allocations.held_per_user())
        now = self.clock()
        head = self.order.head()
        fair = FairOrder.of((e.waiter for e in waiting), head, self.order.running(self.entries.values()), now=now)
        d = dispatch(self.pool, fair.waiters, lambda w: w.id, self.order.reservation, now=now,
                     drained=self.order.drained)
        self.order.reserve(d.reservation, d.drained)
        placed = []
        for w, placement in d.placed:
            entry = by_id[w.id]
            entry.placement = placement
            placed.append(entry)
            log.info("Reserved %s for waiting %s/%s", self.pool.describe(placement), w.user, w.server or "-")
        if placed:  # GPUs moved: the order changes. The held allocations and their expected
            # ends do not (they change at a claim or a release, and are reread every
            # RELEASES_TTL): rereading them here cost the next spawn 225 ms at 5,915 servers
            self.order.moved()
        elif self.order.head() == head and len(waiting) == self.order.waiting_count():
            self.order.keep(fair, now)  # the waiters' order as it stands (none expired)
        if d.reservation is not None:
            self._settled = (self.pool, self.pool.releases, by_id[d.reservation[0]], d)
        return placed

    def _settled_pass(self, now: datetime) -> tuple[WaitingServer, Dispatch] | None:
        """The head entry and the last full dispatch, if nothing since could change that pass's
        answer: no release in the pool (nor a new pool), the head still waits, and no waiter
        became old (``waitqueue.RESERVE_AFTER``) since."""
        settled = self._settled
        if settled is None:
            return None
        pool, releases, head, d = settled
        if pool is not self.pool or releases != pool.releases or head.placement is not None or head.expired:
            return None
        if self.entries.get(head.key) is not head or self.order.head() != head.waiter.id:
            return None
        if d.until is not None and now >= d.until:
            return None
        return head, d

    # ---------------------------------------------------- answers, estimates

    def refusal(self, entry: WaitingServer) -> Refused:
        """A waiting entry's answer: its position and estimate (the first shown is recorded)."""
        refused, shown = self._refusal(entry)
        if shown is not None and entry.waiter.id not in self._shown:
            self.ledger.queue.estimate_shown(*shown)
            self._shown.add(entry.waiter.id)
        return refused

    def _refusal(self, entry: WaitingServer) -> tuple[Refused, tuple[Any, ...] | None]:
        """The answer, and the estimate to record (``ledger.queue.estimate_shown``'s arguments)
        unless one was recorded for the entry already (kept for the published accuracy)."""
        now = self.clock()
        position = self.order.position(entry)
        eta = self.eta.estimate_of(entry.waiter.id)
        est = self.eta.range_of(entry.waiter.id, eta)
        shown = None if entry.waiter.id in self._shown else (
            entry.waiter.id, entry.waiter.user, now,
            [None if t is None else max(0, round((t - now).total_seconds())) for t in (est.low, est.mid, est.high)],
            est.basis, None if est.model_s is None else round(min(est.model_s, eta_rules.HORIZON)))
        # those far back ask less often: every retry is work on the writer thread
        retry = now + timedelta(seconds=min(10, 2 + position // 20))
        history = est.basis == "history"
        text = (wait_text(position, eta if history else est.mid, now,  # est: held steady (eta.steady)
                          range_text(est, now) if history else None,
                          None if history else source_note(est.origin, self.settings.expected_session_hours))
                + self.unavailable_note(entry.waiter.request))
        return Refused(RefusalReason.QUEUED, text, retry_at=retry, details={
            "position": position, "queue_length": self.order.waiting_count(), "eta": iso(eta),
            "since": iso(entry.waiter.since), **range_json(est, now)}), shown

    def unavailable_note(self, req: Request) -> str:
        """Why GPUs of the request's models sit unused while it waits: their nodes take no servers
        ("gpu-a is drained: maint"), so the user and the admin see that the queue is not the cause."""
        parts = []
        for node, why in sorted(self.inventory.unavailable.items()):
            ns = self.pool.by_name.get(node)
            if ns is not None and any(model_allowed(normalize_model(g.model), req.models) for g in ns.node.gpus):
                parts.append(f"{node} is {why}")
        if not parts:
            return ""
        return " Nodes with such GPUs that take no servers now: " + "; ".join(parts) + "."

    # ---------------------------------------------------------------- demand

    @writes
    def demand_for(self, user: str, models: Iterable[str]) -> datetime | None:
        """The newest retry of another user's waiting entry that GPUs of ``models``
        (pool model strings) would serve: the pressure signal for culling ``user``.
        A user's own entry never counts."""
        ask = (user, frozenset(models))
        return self.demand([ask])[ask]

    @writes
    def demand(self, asks: Iterable[tuple[str, frozenset[str]]]) -> dict[tuple[str, frozenset[str]], datetime | None]:
        """:meth:`demand_for` of many (user, models) at once, in one pass over the entries
        (:func:`~gpupool_hub.queue.pressure.demand`): the cull and idle jobs ask for every holder."""
        return demand([(e.last_seen, e.waiter.user, e.waiter.request.models) for e in self.entries.values()
                       if e.placement is None and not e.expired], asks)

