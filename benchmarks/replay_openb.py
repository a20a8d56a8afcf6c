"""Time replay of Alibaba's openb trace through the wait queue, placement and ETA estimator.

Unlike ``placement_openb.py`` (which fills the cluster once and never lets a
pod leave), pods here arrive and leave: each GPU pod arrives at its
``creation_time`` and holds its GPUs for ``deletion_time - creation_time``.
Arrival times are compressed by one factor so that the offered load (GPU time
asked for over GPU time available, each pod's hold counted up to the end of
the arrivals) is ``--load`` of capacity; holding times are kept. Pods that ask
for no GPU are left out (they never wait in the GPU queue).

Each pod gets one of ``USERS`` synthetic users (by a hash of its name) and each
user one of ``TEAMS`` teams with equal quotas; the trace has neither.

Workloads are the pod lists of the trace folder, found by file name
(``benchmarks/replay_workloads.py``; ``--workload all``), with variants made
from them (``--derive``); one without times is reported as skipped.

Schedulers, each on a fresh ``gpupool_hub.placement.Pool`` with FGD:

- ``fifo-fgd``   plain first come, first served, no backfill (the baseline)
- ``project``    the hub's queue (``queue.order.fair_order`` + ``queue.dispatch.dispatch``:
                 round-robin across users, backfill around a reserved node, old
                 waiters closing their nodes) with the ETA of ``gpupool_hub.queue.estimates``:
                 the need ahead over the rate the queue was served lately (with
                 ``--forecast``, issue 41's rule: the time by which what the held
                 servers of the waiter's models will free covers it), the range
                 calibrated on the starts
                 so far and the misses of those still waiting; its history is
                 the workload's earlier pods (``--past-split``: the first half
                 of the arrivals are the hub's closed sessions, only the rest
                 is replayed, so the estimator never sees what it is scored
                 on); with
                 ``--today``, today's estimate (known ends, else a typical session
                 of 4 h) is scored on the same waiters
- with ``--variants``, dispatch rules for tuning: ``fifo-backfill`` (arrival
  order, backfill around a reserved node) and ``rr-nobackfill`` (round-robin,
  no backfill)

Reported per scheduler: wait p50/p95/p99 (every GPU pod, 0 when it starts at
once), mean GPU utilisation over the arrivals and its course, fragmentation
loss (GPU-hours of a model that sat free while someone waited for that
model), the longest wait (starvation), each team's share of the GPU time held
while the queue was not empty against its max-min fair share, and ETA
accuracy as the admin page measures it (``eta.accuracy``): for each pod that
waited, the range shown when it joined against its real start (the share
inside what the range's words cover; the median error as a share of the wait
for waits of 5 minutes or more, in seconds for shorter ones).

    python benchmarks/replay_openb.py --workload all --load 1.1
    python benchmarks/replay_openb.py --workload all --load 0.9 1.1 1.3 --derive all --seed 42 43
    python benchmarks/replay_openb.py --trace DIR --workload all

The trace folder is found as ``placement_openb.py`` finds it (``--trace DIR``,
``GPUPOOL_OPENB_TRACE``, or ``shared/traces/openb``). Each run (workload,
load, seed) prints one JSON line; the last line is the summary (the worst of
each measure and where).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import json
import random
import sys
import time
from functools import partial
from operator import attrgetter, itemgetter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.placement_openb import TraceNotFound, load_cluster, resolve_trace  # noqa: E402
from gpupool_hub.queue import estimates as eta  # noqa: E402
from gpupool_hub.placement import ModelUnavailable, NoCapacity, Pool, Request, get_policy, load_nodes  # noqa: E402
from gpupool_hub.placement.request import normalize_model  # noqa: E402
from benchmarks.replay_workloads import (DERIVED, TEAMS, NoTimes, Pod, compress, derive,  # noqa: E402
                                         find_workloads, load_timed_pods, past_sessions, resize, split_past)
from gpupool_hub.queue.forecast import Forecast  # noqa: E402
from gpupool_hub.queue.order import BORROWER, UNDER_QUOTA, FairOrder, Waiter
from gpupool_hub.queue.dispatch import Dispatch, dispatch, join_behind, reserve_node
from gpupool_hub.queue.drains import node_gpus
from gpupool_hub.queue.starts import ExpectedRelease, estimate_starts
from gpupool_hub.queue.calibration import Calibration, calibration_class
from gpupool_hub.queue.flow import Arrivals, Drain, Overtaking
from gpupool_hub.queue.history import SessionHistory, profile_key
from gpupool_hub.queue.shown import SHORT_S, accuracy

TYPICAL_S = 4 * 3600.0  # c.GPUPool.expected_session_hours' default: today's estimator
CHAIN_ROUNDS = 3  # as service/core/queue_eta.py
HISTORY_REFRESH_S = 600.0  # the project's estimator reads the history every 10 simulated minutes
RELEASES_TTL_S = 30.0  # expected releases reused this long, as the service does (core/queue_eta.py: RELEASES_TTL)
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
TARGET_IN_RANGE = 0.80
TARGET_ERROR_LONG = 0.25  # relative, waits of SHORT_S or more
TARGET_ERROR_SHORT_S = 60.0  # seconds, shorter waits
TARGET_P95_RATIO = 0.8  # judged on the workloads that are not share-heavy (SHARE_HEAVY)
#: a workload is share-heavy when more than this part of its GPU pods ask for a share of one GPU
#: (the trace's gpushare40: 56 %, the share variants about 80 %; default 43 %): FIFO already starts
#: most of them at once there, and the issue judges wait p95 on the other workloads only
SHARE_HEAVY = 0.5
TARGET_WALL_S = 120.0
#: waits a median error needs before its target is judged (a median of three waits is no measure)
MIN_WAITS = 20
SCHEDULERS = ("fifo-fgd", "project")
VARIANTS = ("fifo-backfill", "rr-nobackfill")


@dataclass
class Result:
    name: str
    waits: List[float] = field(default_factory=list)
    eta: List[Tuple[float, float, float, float]] = field(default_factory=list)  # (low, mid, high, real) waits
    eta_today: List[Tuple[float, float, float, float]] = field(default_factory=list)  # today's rule, same waiters
    eta_basis: Dict[str, int] = field(default_factory=dict)
    util_area: float = 0.0
    util_waiting_area: float = 0.0
    util_series: List[float] = field(default_factory=list)
    frag_gpu_s: float = 0.0
    team_held: List[float] = field(default_factory=lambda: [0.0] * TEAMS)
    team_fair: List[float] = field(default_factory=lambda: [0.0] * TEAMS)
    contended_s: float = 0.0
    dropped: int = 0
    wall_s: float = 0.0
    capacity: int = 1


def pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def max_min_fair(demand: Sequence[float], capacity: float) -> List[float]:
    """Water-filling with equal quotas: each team gets its demand, up to an equal share of what is left."""
    out = [0.0] * len(demand)
    left, active = capacity, [i for i, d in enumerate(demand) if d > 0]
    while active and left > 1e-9:
        share = left / len(active)
        done = [i for i in active if demand[i] - out[i] <= share]
        if not done:
            for i in active:
                out[i] += share
            break
        for i in done:
            left -= demand[i] - out[i]
            out[i] = demand[i]
        active = [i for i in active if i not in done]
    return out


class Replay:
    """One scheduler over one pod list, in simulated time."""

    def __init__(self, nodes: List[dict], pods: List[Pod], scheduler: str, seed: int,
                 compare_today: bool = True, past: Sequence[Tuple[str, str, float]] = (),
                 use_forecast: bool = False) -> None:
        self.pool = Pool(load_nodes(nodes), policy=get_policy("fgd"), seed=seed)
        if scheduler == "project":
            # the hub declares its configured profiles (service/core/pool_inventory.py): here the
            # workload's distinct request shapes, with no floor in FGD's mix (history weighs them)
            self.pool.expect({r: 0.0 for r in {p.request for p in pods}})
        self.cap = self.pool.capacity_gpu_milli
        self.pods = pods
        self.kind = scheduler
        self.fair = scheduler in ("project", "rr-nobackfill")
        self.backfill = scheduler in ("project", "fifo-backfill")
        self.waiting: Dict[str, Tuple[Pod, Waiter]] = {}
        # (priority, arrival, name, waiter) of the waiting, sorted (names are unique: waiters are never compared)
        self.queue: List[Tuple[int, float, str, Waiter]] = []
        self.queue_key: Dict[str, Tuple[int, float, str, Waiter]] = {}
        self.never: Dict[Tuple[Any, ...], bool] = {}  # per request shape: fits no node even when empty
        # kept as waiters join and leave, for the accounting at every event
        self.team_waiting = [0] * TEAMS
        self.wanted: Dict[Optional[str], int] = {}  # model (None: any) -> waiters that can use it
        self.reservation: Optional[Tuple[str, str]] = None
        self.drained: frozenset = frozenset()  # nodes drained for old waiters of several GPUs, kept between passes
        self.last_pass: Optional[Dispatch] = None  # the last full dispatch pass (backfill schedulers)
        self.settled = True  # no release since the last full dispatch pass
        self.held: Dict[str, Tuple[Pod, float, Any]] = {}  # pod name -> (pod, start, placement)
        self.held_by_user: Dict[str, int] = {}
        self.team_milli = [0] * TEAMS
        self.free_by_model: Dict[str, int] = {}  # kept by start/leave: the pool has no such sum
        for ns in self.pool.nodes:
            for s, mk in enumerate(ns.slot_model):
                self.free_by_model[mk] = self.free_by_model.get(mk, 0) + ns.cap[s]
        # the hub's past (its 90 days of closed sessions): a hub is not new when a burst comes, and a
        # history of only what ended since the replay began knows no session longer than its age.
        # With a past, the replay's own ended sessions stay out of it: its arrivals squeeze the
        # trace's weeks into minutes, so they would weigh as much as those weeks, and they are the
        # short ones (what ended so soon)
        self.history = SessionHistory(past)
        self.learn = not past
        self.snapshot = SessionHistory()
        self.snapshot_at = -1e18
        self.shown: Dict[str, Tuple[float, float, float, str]] = {}
        self.shown_today: Dict[str, Tuple[float, float, float, str]] = {}
        self.compare_today = compare_today
        self.calibration = Calibration()  # the project's shown estimates against real starts so far
        self.model_s: Dict[str, float] = {}  # the model's own point estimate at join
        self.served = Drain()  # the GPU share started from the queue lately
        self.joined = Arrivals()  # who joined the queue lately (those the fair order puts ahead)
        self.cache_at = -1e18
        self.curves: Dict[Any, Any] = {}
        self.running: List[eta.Running] = []
        self.forecast: Optional[Forecast] = None
        self.use_forecast = use_forecast  # issue 41's forecast of what frees, for comparison (--forecast)
        self.releases: List[ExpectedRelease] = []
        self.res = Result(scheduler, capacity=self.cap)
        self.order_kept: Optional[Tuple[Optional[str], FairOrder]] = None  # (head, the fair order) while valid
        self.gone: Optional[str] = None  # the waiter unwait() took out of the queue (start() rekeys its user)
        self.now = 0.0
        self.seq = 0

    # ------------------------------------------------------------ queue rules

    def ordered(self) -> List[Waiter]:
        if not self.fair:
            return list(map(itemgetter(3), self.queue))  # one priority class: arrival order
        head = self.reservation[0] if self.reservation else None
        kept = self.order_kept
        if kept is None or kept[0] != head or (kept[1].until is not None and self.clock() >= kept[1].until):
            # self.queue is in Waiter.order_key order: fair_order's first sort finds it sorted
            kept = self.order_kept = (head, FairOrder.of(map(itemgetter(3), self.queue), head, self.held_by_user,
                                                         now=self.clock()))
        return kept[1].waiters

    def wait(self, pod: Pod, w: Waiter) -> None:
        self.waiting[pod.name] = (pod, w)
        self.queue_key[pod.name] = key = (w.priority, self.now, pod.name, w)
        bisect.insort(self.queue, key)
        if self.order_kept is not None:  # a newcomer behind everyone: put in its place, not resorted
            got = self.order_kept[1].behind(w, self.held_by_user)
            self.order_kept = None if got is None else (self.order_kept[0], got)
        self.team_waiting[pod.team] += pod.request.total_gpu_milli
        for mk in w.request.models if w.request.models is not None else (None,):
            self.wanted[mk] = self.wanted.get(mk, 0) + 1

    def rekey(self, user: str, gone: Optional[str] = None) -> None:
        """The fair order kept, with ``user``'s waiters moved (their round changed, ``gone`` left)."""
        if self.order_kept is not None:
            head = self.order_kept[0]
            self.order_kept = (head, self.order_kept[1].rekeyed(user, self.held_by_user, head, gone))

    def unwait(self, name: str) -> Pod:
        pod, w = self.waiting.pop(name)
        self.gone = name  # it starts next: start() moves its user's waiters, this one gone
        del self.queue[bisect.bisect_left(self.queue, self.queue_key.pop(name))]
        self.team_waiting[pod.team] -= pod.request.total_gpu_milli
        for mk in w.request.models if w.request.models is not None else (None,):
            self.wanted[mk] -= 1
            if not self.wanted[mk]:
                del self.wanted[mk]
        return pod

    def clock(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)

    def join_behind(self, w: Waiter, held: frozenset) -> None:
        """A newcomer behind the head, when nothing was released since the last full pass
        (see :func:`queue.dispatch.join_behind`)."""
        placement = join_behind(self.pool, w, held)
        if placement is not None:
            self.start(self.unwait(w.id), placement, reserved=True)

    def dispatch(self) -> None:
        self.settled = True
        if not self.waiting:
            self.reservation, self.drained = None, frozenset()
            return
        order = self.ordered()
        if self.backfill:
            d = dispatch(self.pool, order, lambda w: w.id, self.reservation, now=self.clock(), drained=self.drained)
            self.reservation, self.drained = d.reservation, d.drained
            self.last_pass = d
            for w, placement in d.placed:
                self.start(self.unwait(w.id), placement, reserved=True)
            return
        for w in order:  # no backfill: stop at the first that does not fit
            try:
                placement = self.pool.allocate(w.id, w.request)
            except (NoCapacity, ModelUnavailable):
                break
            self.start(self.unwait(w.id), placement, reserved=True)

    def arrive(self, pod: Pod) -> None:
        team_quota = self.cap / TEAMS
        priority = UNDER_QUOTA if self.fair and self.team_milli[pod.team] + pod.request.total_gpu_milli <= team_quota \
            else BORROWER
        w = Waiter(pod.name, pod.user, pod.name, pod.request, EPOCH + timedelta(seconds=self.now), priority)
        if not self.waiting or (self.fair and priority == UNDER_QUOTA):
            try:
                self.start(pod, self.pool.allocate(pod.name, pod.request))
                return
            except (NoCapacity, ModelUnavailable):
                pass
        never = self.never.get(w.shape)
        if never is None:  # the node list is fixed: whether a shape could ever fit is asked once
            never = self.never[w.shape] = reserve_node(self.pool, pod.request) is None
        if never:  # fits no node ever: the hub refuses it
            self.res.dropped += 1
            return
        self.wait(pod, w)
        head = self.waiting[self.reservation[0]][1] if self.backfill and self.reservation else None
        d = self.last_pass
        if self.settled and head is not None and w.priority >= head.priority and d is not None and \
                (d.until is None or self.clock() < d.until):  # nobody became old since the last pass
            self.join_behind(w, d.closed_to(w.priority))  # what a full pass would do, in one step
        else:
            self.dispatch()
        if pod.name in self.waiting and self.kind == "project":
            # it waits (as the service counts), for so many GPUs of one node
            self.joined.add(self.now, pod.user, pod.request.total_gpu_milli, node_gpus(self.waiting[pod.name][1]))
            self.estimate(pod.name)

    def start(self, pod: Pod, placement: Any, reserved: bool = False) -> None:
        self.res.waits.append(self.now - pod.arrive)
        shown = self.shown.pop(pod.name, None)
        if shown is not None:
            real = self.now - pod.arrive
            lo, mid, hi, basis = shown
            self.res.eta.append((lo, mid, hi, real))
            self.res.eta_basis[basis] = self.res.eta_basis.get(basis, 0) + 1
            today = self.shown_today.pop(pod.name, None)
            if today is not None:
                self.res.eta_today.append((*today[:3], real))
            self.served.add(self.now, pod.request.total_gpu_milli,
                            normalize_model(placement.gpus[0].model) if placement.gpus else None)
            if pod.name in self.model_s:
                self.calibration.add(self.model_s.pop(pod.name), real, calibration_class(pod.request))
        self.held[pod.name] = (pod, self.now, placement)
        self.held_by_user[pod.user] = self.held_by_user.get(pod.user, 0) + 1
        self.rekey(pod.user, pod.name if self.gone == pod.name else None)  # the user's round moved
        self.team_milli[pod.team] += placement.gpu_milli
        for g in placement.gpus:
            self.free_by_model[normalize_model(g.model)] -= g.milli
        self.push(self.now + pod.hold, "leave", pod.name)

    def leave(self, name: str) -> None:
        pod, started, placement = self.held.pop(name)
        self.pool.release(name)
        self.settled = False  # until the next full dispatch pass
        self.held_by_user[pod.user] -= 1
        self.rekey(pod.user)
        self.team_milli[pod.team] -= placement.gpu_milli
        for g in placement.gpus:
            self.free_by_model[normalize_model(g.model)] += g.milli
            self.served.released(self.now, g.milli, normalize_model(g.model))
        r = pod.request
        if self.learn:
            self.history.add(profile_key(r.gpus, r.gpu_milli), pod.user, self.now - started)

    # ------------------------------------------------------------ estimates

    def free_milli(self) -> Dict[str, int]:
        return dict(self.free_by_model)

    def estimate(self, name: str) -> None:
        """What the newcomer ``name`` is shown: the project's range (``self.shown``) and, for
        comparison, today's single-point rule (``self.shown_today``), from the same queue."""
        order = self.ordered()
        upto = list(map(attrgetter("id"), order)).index(name) + 1  # read in C: the queue holds thousands
        order = order[:upto]
        now = EPOCH + timedelta(seconds=self.now)
        stale = self.now - self.cache_at >= RELEASES_TTL_S
        if stale:
            self.cache_at = self.now
        today = self.today(order, name, now, stale) if self.compare_today else None
        got = self.project(order, name, now, stale)
        if got is not None:
            if got.model_s is not None:
                self.model_s[name] = got.model_s
            self.shown[name] = (*(((t - now).total_seconds() if t is not None else float("inf"))
                                  for t in (got.low, got.mid, got.high)), got.basis)
        else:
            today = today if today is not None else self.today(order, name, now, stale)
            self.shown[name] = (today, today, today, "fallback")
        if self.compare_today:
            self.shown_today[name] = (today, today, today, "fallback")

    def project(self, order: List[Waiter], name: str, now: datetime, stale: bool) -> Optional[eta.Estimate]:
        if not self.learn:  # a past only: the history never changes
            self.snapshot = self.history
        elif self.now - self.snapshot_at >= HISTORY_REFRESH_S or not self.snapshot.enough:
            self.snapshot = SessionHistory()
            for key, xs in self.history.by_user.items():
                for x in xs:
                    self.snapshot.add(key[1], key[0], x)
            self.snapshot_at = self.now
        if stale:
            self.calibration.waiting((self.model_s[n], self.now - pod.arrive, calibration_class(pod.request))
                                     for n, (pod, _) in self.waiting.items() if n in self.model_s)
            self.curves = {}
            self.running = [eta.Running(normalize_model(placement.gpus[0].model), placement.gpu_milli,
                                        profile_key(pod.request.gpus, pod.request.gpu_milli), pod.user,
                                        self.now - started)
                            for pod, started, placement in self.held.values() if placement.gpus]
            self.forecast = Forecast(self.running, self.snapshot) if self.use_forecast else None
        # everyone queued was just dispatched and did not fit: what the pool shows free is of no
        # use to them (scattered over nodes, or short of CPU or memory)
        kept = self.order_kept[1] if self.fair and self.order_kept is not None else None
        overtaking = Overtaking(kept, self.joined.rates(self.now), self.held_by_user,
                                partial(self.joined.rates, self.now)) if kept else None
        return eta.estimate_ranges(order, {}, self.running, self.snapshot, now, curves=self.curves,
                                   only=name, calibration=self.calibration, overtaking=overtaking,
                                   drain=self.served.rates(self.now), forecast=self.forecast).get(name)

    def today(self, order: List[Waiter], name: str, now: datetime, stale: bool) -> float:
        """Today's rule: known ends else created + typical session, chained a few rounds."""
        if stale or not self.releases:
            self.releases = [ExpectedRelease(pl.node, g.milli, normalize_model(g.model),
                                             now + timedelta(seconds=max(0.0, started + TYPICAL_S - self.now)))
                             for pod, started, pl in self.held.values() for g in pl.gpus]
        releases, free = self.releases, self.free_milli()
        out = estimate_starts(order, free, releases, now)
        typical = timedelta(seconds=TYPICAL_S)
        for _ in range(CHAIN_ROUNDS):
            chained = [ExpectedRelease("", w.request.total_gpu_milli, min(w.request.models), at + typical)
                       for w in order if (at := out.get(w.id)) is not None and w.request.models]
            if not chained:  # nothing to chain: the same releases give the same estimates
                break
            again = estimate_starts(order, free, releases + chained, now)
            if again == out:
                break
            out = again
        at = out.get(name)
        return (at - now).total_seconds() if at is not None else float("inf")

    # ------------------------------------------------------------ time

    def push(self, at: float, kind: str, name: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, 0 if kind == "leave" else 1, self.seq, kind, name))

    def account(self, until: float, end: float) -> None:
        """Integrate utilisation, fragmentation loss and team shares over [now, until)."""
        dt = until - self.now
        if dt <= 0:
            return
        if self.now < end:
            self.res.util_area += self.pool.allocated_gpu_milli * min(dt, end - self.now)
        if self.waiting:
            wanted, any_model = self.wanted, None in self.wanted
            self.res.frag_gpu_s += dt * sum(m for mk, m in self.free_by_model.items()
                                            if any_model or mk in wanted) / 1000
            demand = [float(self.team_waiting[t] + self.team_milli[t]) for t in range(TEAMS)]
            fair = max_min_fair(demand, self.cap)
            for t in range(TEAMS):
                self.res.team_held[t] += self.team_milli[t] * dt
                self.res.team_fair[t] += fair[t] * dt
            self.res.contended_s += dt
            self.res.util_waiting_area += self.pool.allocated_gpu_milli * dt

    def run(self) -> Result:
        t0 = time.perf_counter()
        self.events: List[Tuple[float, int, int, str, str]] = []
        for p in self.pods:
            self.push(p.arrive, "arrive", p.name)
        by_name = {p.name: p for p in self.pods}
        end = max(p.arrive for p in self.pods) or 1.0
        buckets = 20
        series = [0.0] * buckets
        while self.events:
            at, _, _, kind, name = heapq.heappop(self.events)
            if at > self.now:
                b0 = self.now
                self.account(at, end)
                if b0 < end:
                    i = min(buckets - 1, int(b0 / end * buckets))
                    series[i] += self.pool.allocated_gpu_milli * (min(at, end) - b0)
                self.now = at
            if kind == "leave":
                self.leave(name)
                if not self.events or self.events[0][3] != "leave" or self.events[0][0] > self.now:
                    self.dispatch()
            else:
                self.arrive(by_name[name])
        self.res.util_series = [round(s / (self.cap * end / buckets), 3) for s in series]
        self.res.util_area /= self.cap * end
        self.res.wall_s = time.perf_counter() - t0
        return self.res


def eta_figures(rows: List[Tuple[float, float, float, float]], prefix: str = "eta_") -> Dict[str, Any]:
    """The accuracy measures of the admin page (``accuracy``) over (low, mid, high, real) waits."""
    inf = float("inf")
    acc = accuracy((None if lo == inf else lo, None if mid == inf else mid, None if hi == inf else hi, real)
                       for lo, mid, hi, real in rows)
    return {f"{prefix}in_range": acc.in_range, f"{prefix}median_abs_error": acc.median_error,
            f"{prefix}no_estimate": sum(1 for _, mid, _, _ in rows if mid == inf),
            f"{prefix}median_abs_error_long": acc.median_error_long,
            f"{prefix}median_abs_error_short_s": acc.median_error_short_s, f"{prefix}estimates": acc.starts,
            f"{prefix}long_estimates": acc.long_starts}


def figures(res: Result) -> Dict[str, Any]:
    excess = [(h - f) / max(f, 1e-9) for h, f in zip(res.team_held, res.team_fair)] if res.contended_s else [0.0]
    held_share = [h / max(sum(res.team_held), 1e-9) for h in res.team_held]
    fair_share = [f / max(sum(res.team_fair), 1e-9) for f in res.team_fair]
    return {
        "wait_p50_s": round(pct(res.waits, 0.5), 1), "wait_p95_s": round(pct(res.waits, 0.95), 1),
        "wait_p99_s": round(pct(res.waits, 0.99), 1), "wait_max_s": round(max(res.waits, default=0.0), 1),
        "waited": sum(1 for w in res.waits if w > 0), "started": len(res.waits), "dropped": res.dropped,
        # how full the pool was while anyone waited (what fragmentation and the queue's order cost)
        "utilization": round(res.util_waiting_area / max(res.contended_s, 1e-9) / res.capacity, 4),
        "utilization_arrivals": round(res.util_area, 4), "utilization_series": res.util_series,
        "fragmentation_loss_gpu_h": round(res.frag_gpu_s / 3600, 1),
        # how far the team furthest above its max-min fair share of GPU time (while anyone waited) was above it
        "team_share_excess_pt": round(100 * max(h - f for h, f in zip(held_share, fair_share)), 2),
        "team_excess_rel_max": round(max(excess), 3),
        **eta_figures(res.eta), **(eta_figures(res.eta_today, "today_eta_") if res.eta_today else {}),
        "eta_basis": res.eta_basis, "wall_s": round(res.wall_s, 1),
    }


#: what each JSON line carries of the project's figures (and FIFO + FGD's p95 and longest wait)
REPORTED = ("eta_in_range", "eta_median_abs_error", "eta_median_abs_error_long", "eta_median_abs_error_short_s",
            "eta_estimates", "eta_long_estimates", "eta_no_estimate", "wait_p50_s", "wait_p95_s", "wait_p99_s", "wait_max_s",
            "utilization", "fragmentation_loss_gpu_h", "team_share_excess_pt", "today_eta_in_range",
            "today_eta_median_abs_error", "eta_basis")


def checks(proj: Dict[str, Any], base: Dict[str, Any], share_heavy: bool = False) -> List[Tuple[str, bool, str]]:
    """The issue's targets for one workload and load: (what, reached, figures); wait p95
    is judged where the workload is not ``share_heavy``."""
    def fig(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    long_err, short_err = proj["eta_median_abs_error_long"], proj["eta_median_abs_error_short_s"]
    if proj["eta_long_estimates"] < MIN_WAITS:
        long_err = None
    if proj["eta_estimates"] - proj["eta_long_estimates"] < MIN_WAITS:
        short_err = None
    return [
        ("ETA: starts inside the shown range", proj["eta_in_range"] is None or proj["eta_in_range"] >= TARGET_IN_RANGE,
         f"{fig(proj['eta_in_range'], '.1%')} (target ≥ {TARGET_IN_RANGE:.0%})"),
        (f"ETA: median error, waits ≥ {SHORT_S / 60:g} min", long_err is None or long_err <= TARGET_ERROR_LONG,
         f"{fig(long_err, '.1%')} of the wait ({proj['eta_long_estimates']} waits; target ≤ {TARGET_ERROR_LONG:.0%})"),
        (f"ETA: median error, waits < {SHORT_S / 60:g} min",
         short_err is None or short_err <= TARGET_ERROR_SHORT_S,
         f"{fig(short_err, '.0f')} s (target ≤ {TARGET_ERROR_SHORT_S:.0f} s)"),
        ("no starvation (longest wait ≤ FIFO+FGD's)", proj["wait_max_s"] <= base["wait_max_s"],
         f"{proj['wait_max_s']:.0f} s vs {base['wait_max_s']:.0f} s"),
        (f"wait p95 ≤ {TARGET_P95_RATIO:g} × FIFO+FGD's (not share-heavy)",
         share_heavy or proj["wait_p95_s"] <= TARGET_P95_RATIO * base["wait_p95_s"],
         f"{proj['wait_p95_s']:.0f} s vs {base['wait_p95_s']:.0f} s"
         + (" (share-heavy: not judged)" if share_heavy else "")),
    ]


def replay_one(nodes: List[dict], pods: List[Pod], seed: int, schedulers: Sequence[str],
               compare_today: bool, past: Sequence[Tuple[str, str, float]] = (),
               use_forecast: bool = False) -> Dict[str, Dict[str, Any]]:
    return {sched: figures(Replay(nodes, pods, sched, seed, compare_today=compare_today, past=past,
                                  use_forecast=use_forecast).run())
            for sched in schedulers}


def print_rows(rows: Dict[str, Dict[str, Any]]) -> None:
    print(f"{'scheduler':<14} {'p50 s':>8} {'p95 s':>9} {'p99 s':>9} {'max s':>9} {'util':>6} "
          f"{'frag GPU-h':>10} {'team +pt':>8} {'in range':>8} {'err':>6} {'err≥5m':>7} {'err<5m':>7} {'wall s':>6}")

    def pc(v: Any) -> str:
        return f"{v:.0%}" if v is not None else "-"
    for sched, r in rows.items():
        short = r["eta_median_abs_error_short_s"]
        print(f"{sched:<14} {r['wait_p50_s']:>8.0f} {r['wait_p95_s']:>9.0f} {r['wait_p99_s']:>9.0f} "
              f"{r['wait_max_s']:>9.0f} {r['utilization']:>6.1%} {r['fragmentation_loss_gpu_h']:>10.1f} "
              f"{r['team_share_excess_pt']:>8.2f} {pc(r['eta_in_range']):>8} {pc(r['eta_median_abs_error']):>6} "
              f"{pc(r['eta_median_abs_error_long']):>7} {(f'{short:.0f} s' if short is not None else '-'):>7} "
              f"{r['wall_s']:>6.1f}")
        if r.get("today_eta_in_range") is not None:
            print(f"{'  today ETA':<14} {'':>8} {'':>9} {'':>9} {'':>9} {'':>6} {'':>10} {'':>8} "
                  f"{pc(r['today_eta_in_range']):>8} {pc(r['today_eta_median_abs_error']):>6} "
                  f"{pc(r['today_eta_median_abs_error_long']):>7} "
                  f"{(str(round(r['today_eta_median_abs_error_short_s'] or 0)) + ' s'):>7}")


def summarise(lines: List[Dict[str, Any]], skipped: List[Dict[str, Any]], wall: float) -> Dict[str, Any]:
    """The worst of every measure over the workloads, loads and seeds run, and where it was."""
    ran = [x for x in lines if "skipped" not in x]

    def judged(x: Dict[str, Any], key: str) -> bool:
        """A median error counts where at least ``MIN_WAITS`` waits of its kind started."""
        long = x["eta_long_estimates"]
        if key == "eta_median_abs_error_long":
            return long >= MIN_WAITS
        return key != "eta_median_abs_error_short_s" or x["eta_estimates"] - long >= MIN_WAITS

    def worst(key: str, pick: Any) -> Dict[str, Any]:
        have = [x for x in ran if x.get(key) is not None and judged(x, key)]
        if not have:
            return {"value": None}
        x = pick(have, key=lambda y: y[key])
        return {"value": x[key], "workload": x["workload"], "load": x["load"], "seed": x["seed"]}

    ratio = [dict(x, max_ratio=round(x["wait_max_s"] / max(x["fifo_fgd_wait_max_s"], 1e-9), 3)) for x in ran]
    return {"summary": True, "runs": len(ran), "skipped": [x["workload"] for x in skipped],
            "eta_in_range": worst("eta_in_range", min),
            "eta_median_abs_error": worst("eta_median_abs_error", max),
            "eta_median_abs_error_long": worst("eta_median_abs_error_long", max),
            "eta_median_abs_error_short_s": worst("eta_median_abs_error_short_s", max),
            "wait_max_over_fifo_fgd": (max(ratio, key=lambda y: y["max_ratio"]) and {
                k: max(ratio, key=lambda y: y["max_ratio"])[k] for k in
                ("max_ratio", "wait_max_s", "fifo_fgd_wait_max_s", "workload", "load", "seed")}) if ratio else None,
            # the worst p95 ratio where it is judged (workloads not share-heavy)
            "wait_p95_over_fifo_fgd": round(max((x["wait_p95_s"] / max(x["fifo_fgd_wait_p95_s"], 1e-9) for x in ran
                                                 if not x.get("share_heavy")), default=0.0), 3),
            "runs_missed": sum(1 for x in ran if not x["targets_reached"]),
            "eta_no_estimate": sum(x.get("eta_no_estimate") or 0 for x in ran),
            "targets_reached": all(x["targets_reached"] for x in ran),
            "targets_missed": sorted({f"{x['workload']}@{x['load']:g}/{x['seed']}: {m}" for x in ran
                                      for m in x["missed"]}),
            "slowest_run_s": max((x["wall_s"] for x in ran), default=0.0), "wall_s": round(wall, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", "--trace-dir", dest="trace", default=None)
    ap.add_argument("--workload", nargs="+", default=["all"],
                    help="pod list name(s) (openb_pod_list_NAME.csv in the trace folder), or all")
    ap.add_argument("--derive", default="",
                    help=f"also replay variants of each workload: a comma list of {', '.join(DERIVED)} (or all)")
    ap.add_argument("--load", type=float, nargs="+", default=[1.1], help="offered load(s), fractions of capacity")
    ap.add_argument("--nodes", type=int, default=1000,
                    help="replay on this many of the trace's nodes (a seeded sample; 0: all of them)")
    ap.add_argument("--pods", type=int, default=10000,
                    help="this many GPU pods: a subset, or the trace's plus copies arriving at other pods' times "
                         "(0: the trace's own)")
    ap.add_argument("--seed", type=int, nargs="+", default=[42])
    ap.add_argument("--past-split", type=float, default=0.5,
                    help="the first this share of each workload's arrivals are the hub's closed sessions (its "
                         "history); only the rest is replayed (0: no past, the history is what ends in the replay)")
    ap.add_argument("--past-leaky", action="store_true",
                    help="OPTIMISTIC, for comparison only: the history is the replayed pods' own holds (the "
                         "estimator knows the sessions it is scored on; the rule before issue 50)")
    ap.add_argument("--forecast", action="store_true",
                    help="point estimates from issue 41's forecast of what the pool frees (queue.forecast) "
                         "instead of the rate the queue was served, as the service did before issue 50")
    ap.add_argument("--variants", action="store_true", help=f"also run the dispatch rules {', '.join(VARIANTS)}")
    ap.add_argument("--today", action="store_true",
                    help="also score today's single-point estimate on the same waiters (slower: about +40 %%)")
    ap.add_argument("--no-today", action="store_true", help=argparse.SUPPRESS)  # the default now
    args = ap.parse_args(argv)
    kinds = list(DERIVED) if args.derive == "all" else [k for k in args.derive.split(",") if k]
    if not 0.0 <= args.past_split < 1.0:
        ap.error(f"--past-split must be at least 0 and below 1, not {args.past_split:g}")
    past_of = "leaky (optimistic)" if args.past_leaky else f"split {args.past_split:g}"
    try:
        trace = resolve_trace(args.trace)
    except TraceNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = find_workloads(trace) if args.workload == ["all"] else args.workload
    if not names:
        print(f"error: no openb_pod_list_*.csv in {trace}", file=sys.stderr)
        return 2
    schedulers = SCHEDULERS + (VARIANTS if args.variants else ())
    all_nodes = load_cluster(trace)
    t_all = time.perf_counter()
    lines: List[Dict[str, Any]] = []
    skipped: List[Dict[str, Any]] = []
    for name in names:
        try:
            base_pods = load_timed_pods(trace, name)
        except (NoTimes, FileNotFoundError) as e:
            skipped.append({"workload": name, "skipped": str(e)})
            print(json.dumps(skipped[-1]))
            continue
        for seed in args.seed:
            rng = random.Random(seed)
            nodes = all_nodes
            if args.nodes and args.nodes < len(nodes):
                nodes = sorted(rng.sample(nodes, args.nodes), key=lambda n: n["name"])
            for wname, pods_w, why in [(name, base_pods, None)] + derive(name, base_pods, nodes, kinds, seed):
                if why:
                    skipped.append({"workload": wname, "skipped": why})
                    print(json.dumps(skipped[-1]))
                    continue
                if args.past_leaky:  # the replayed pods' own holds: the estimator knows what it is scored on
                    past, now_pods = past_sessions(pods_w, apart=True), pods_w
                else:
                    earlier, now_pods = split_past(pods_w, args.past_split)
                    past = past_sessions(earlier)
                pods0 = resize(now_pods, args.pods or None, random.Random(f"{seed}:{wname}"))
                capacity = sum(n["gpus"]["count"] * 1000 for n in nodes)
                for load in args.load:
                    try:
                        pods = compress(pods0, capacity, load)
                    except ValueError as e:
                        skipped.append({"workload": wname, "load": load, "seed": seed, "skipped": str(e)})
                        print(json.dumps(skipped[-1]))
                        continue
                    span_h = (pods[-1].arrive - pods[0].arrive) / 3600
                    print(f"openb time replay: workload {wname}, seed {seed}, {len(nodes)} nodes "
                          f"({capacity // 1000} GPUs), {len(pods)} GPU pods arriving over {span_h:.1f} h, "
                          f"offered load {load:.0%}; past: {past_of}")
                    rows = replay_one(nodes, pods, seed, schedulers, args.today and not args.no_today, past=past,
                                      use_forecast=args.forecast)
                    print_rows(rows)
                    proj, base = rows["project"], rows["fifo-fgd"]
                    share_heavy = sum(1 for p in pods if not p.request.gpus) > SHARE_HEAVY * len(pods)
                    got = checks(proj, base, share_heavy)
                    run_s = sum(r["wall_s"] for r in rows.values())
                    for what, good, fig in got:
                        print(f"  {'reached' if good else 'NOT REACHED'}: {what}: {fig}")
                    print(f"  wait p95 vs FIFO+FGD: {proj['wait_p95_s']:.0f} s vs {base['wait_p95_s']:.0f} s; "
                          f"replay {run_s:.0f} s for {len(rows)} schedulers (target < {TARGET_WALL_S:.0f} s)")
                    lines.append({"workload": wname, "load": load, "seed": seed, "nodes": len(nodes), "past": past_of,
                                  "pods": len(pods), **{k: proj.get(k) for k in REPORTED},
                                  "fifo_fgd_wait_p95_s": base["wait_p95_s"], "fifo_fgd_wait_max_s": base["wait_max_s"],
                                  "share_heavy": share_heavy,
                                  "targets_reached": all(g for _, g, _ in got),
                                  "missed": [w for w, g, _ in got if not g], "wall_s": round(run_s, 1)})
                    print(json.dumps(lines[-1], sort_keys=True))
    summary = summarise(lines, skipped, time.perf_counter() - t_all)
    print(f"wall time {summary['wall_s']:.1f} s; slowest run (one workload, one load) {summary['slowest_run_s']:.1f} s "
          f"(target < {TARGET_WALL_S:.0f} s)")
    print(json.dumps(summary, sort_keys=True))
    return 0 if summary["targets_reached"] and lines else 1


if __name__ == "__main__":
    sys.exit(main())
