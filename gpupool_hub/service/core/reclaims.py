"""Team fair share in the service: what each team holds, and reclaims of
borrowed GPUs for a team within its quota.

The rules are pure (:mod:`gpupool_hub.fairshare`); this unit keeps their state:
reclaims in progress per requesting (user, server), the warnings their victims
see in ``GET me``, until when a preempted team may not preempt anyone, and until
when a preempted (user, server) is not preempted again.

What outlives a restart is derived at start-up (``restore``): cool-downs and
preemption counts from the ``preempt`` audit events, and the guaranteed/borrowed
mark of held servers from the current quotas. Reclaims in progress do not
survive; nor does a reclaim its spawn gave up: the spawner cancels it
(``cancel_pending``), and one nobody asked about for ``ABANDONED_AFTER`` is
dropped before its victims are stopped.
"""

from __future__ import annotations

import dataclasses

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from ... import fairshare
from ...config import GPUPool
from ...ledger import AllocationRecord, AuditEvent, Ledger
from ...placement.request import Request, same_request
from ...placement.state import Placement
from ...reasons import AuditAction, RefusalReason
from ...timefmt import iso, when_text
from ...money.units import plural
from ...takeback.cull import CullWarning
from .errors import Refused
from .pool_inventory import PoolInventory
from .views import ViewCache
from .threads import CoreThreads, writes

log = logging.getLogger("gpupool.reclaims")

# a waiting spawner asks again at least every 10 s; a reclaim nobody asked about for
# this long belongs to a spawn that is gone (hub timeout, cancelled, hub restart)
ABANDONED_AFTER = timedelta(seconds=60)


@dataclass
class Reclaim:
    """Borrowed servers being preempted so that (user, server) can start within its quota.

    The requester's GPUs are reserved in the placement pool at once (``id``,
    ``placement``); the victims' allocations stay in the ledger, and are charged,
    until they are stopped at ``deadline``. The spawner's retry after that gets
    the reserved GPUs; unclaimed, the reservation lapses at ``expires``."""

    id: str
    user: str
    server: str
    team: str
    request: Request
    requested_models: list[str] | None
    placement: Placement
    victims: list[AllocationRecord]
    created_at: datetime
    deadline: datetime
    expires: datetime
    done: set[str] = field(default_factory=set)
    last_asked: datetime | None = None  # the requester's newest (re)try

    @property
    def ready(self) -> bool:
        return all(v.id in self.done for v in self.victims)

    def same_request(self, other: Request, requested_models: list[str] | None) -> bool:
        return same_request(self.request, self.requested_models, other, requested_models)

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.user, "server": self.server, "team": self.team, "node": self.placement.node,
                "deadline": iso(self.deadline), "ready": self.ready,
                "victims": [{"allocation": v.id, "user": v.user, "server": v.server,
                             "team": v.request.get("team"), "released": v.id in self.done} for v in self.victims]}


class PreemptWitnesses(Protocol):
    """Who hears of a preemption: its audit event is recorded (the victim's notice comes from it), and
    the node agents are told that the victim's processes on GPUs it no longer holds are stray."""

    def record(self, event: AuditEvent) -> Any: ...

    def gpus_taken(self, user: str, server: str, at: datetime) -> None: ...


class Reclaims:
    """Fair-share state and the reclaim lifecycle: start, claim, preempt, cancel, expire."""

    def __init__(self, settings: GPUPool, ledger: Ledger, inventory: PoolInventory, cache: ViewCache,
                 clock: Callable[[], datetime], *, witnesses: PreemptWitnesses | None = None,
                 threads: CoreThreads | None = None) -> None:
        self.settings = settings
        self.teams = settings.team_table()
        self.ledger = ledger
        self.inventory = inventory
        self.cache = cache
        self.clock = clock
        self.threads = threads
        # a preempt event is recorded and the victim's GPUs marked taken (without witnesses: the audit log only)
        self.witnesses = witnesses
        self.active: dict[tuple[str, str], Reclaim] = {}
        self.warnings: dict[str, CullWarning] = {}
        self.cooldown_until: dict[str, datetime] = {}
        self.preemptions: dict[str, int] = {}  # per victim team, in the audit log
        # a preempted (user, server) restarted on borrowed GPUs is spared until then
        self.victim_cooldown_until: dict[tuple[str, str], datetime] = {}
        # called with a new Reclaim; the service stops the victims' servers after the grace
        # and calls preempt() for each (without it, callers do that themselves)
        self.on_reclaim: Callable[[Reclaim], None] | None = None

    def announce_to(self, on_reclaim: Callable[[Reclaim], None]) -> None:
        """Hand each new reclaim to ``on_reclaim`` (the service's executor stops the victims)."""
        self.on_reclaim = on_reclaim

    @property
    def pool(self) -> Any:
        return self.inventory.pool

    def pending(self, user: str, server: str) -> Reclaim | None:
        return self.active.get((user, server))

    def holdings(self, exclude: str | None = None) -> list[fairshare.Holding]:
        """What each team holds, as admission sees it: active allocations with their team
        (older ones without a team: the default team), minus servers being preempted,
        plus GPUs reserved for a reclaim (they count for the team they are reserved for)."""
        leaving = {v.id for rc in self.active.values() for v in rc.victims}
        out = []
        for r in self.ledger.allocations.active():
            if r.id in leaving:
                continue
            out.append(fairshare.Holding(
                id=r.id, team=r.request.get("team") or self.teams.default_team,
                milli=sum(g["milli"] for g in r.gpus), model=r.gpus[0]["model"] if r.gpus else "",
                borrowed=r.borrowed, created_at=r.created_at, node=r.node, user=r.user, server=r.server))
        for rc in self.active.values():
            if rc.id != exclude:
                out.append(fairshare.Holding(
                    id=rc.id, team=rc.team, milli=rc.placement.gpu_milli,
                    model=rc.placement.gpus[0].model if rc.placement.gpus else "", borrowed=False,
                    created_at=rc.created_at, node=rc.placement.node, user=rc.user, server=rc.server))
        return out

    @writes
    def team_report(self) -> dict[str, Any]:
        now = self.clock()
        teams = self.teams.report(self.holdings()) if self.teams.enabled else []  # reads every allocation
        for t in teams:
            until = self.cooldown_until.get(t["team"])
            t["preempted"] = self.preemptions.get(t["team"], 0)
            t["cooldown_until"] = iso(until) if until and until > now else None
        return {"enabled": self.teams.enabled, "default_team": self.teams.default_team,
                "preempt_grace_seconds": self.settings.preempt_grace, "teams": teams,
                "reclaims": [rc.as_dict() for rc in self.active.values()]}

    def start(self, user: str, server: str, team: str, usage: fairshare.TeamUsage,
              holdings: list[fairshare.Holding], req: Request, requested_models: list[str] | None) -> None:
        """No room: if the request is within its team's quota and borrowed GPUs of teams
        over quota would make it fit, reserve the GPUs, warn the victims and raise
        ``Refused(RECLAIMING)``. Returns when there is nothing to reclaim."""
        now = self.clock()
        models = self.inventory.models_matching(req.models)
        if not fairshare.may_preempt(self.teams, team, req.total_gpu_milli, usage, now,
                                     self.cooldown_until, models):
            return
        if self.teams.quota(team).models:  # place only on models still within the team's quota
            ok = [m for m in models if self.teams.within_quota(team, req.total_gpu_milli, usage, m)]
            req = dataclasses.replace(req, models=frozenset(ok))
        candidates = fairshare.preemptible(
            holdings, now, timedelta(seconds=self.settings.preempt_min_runtime), self.victim_cooldown_until)
        victims = fairshare.choose_victims(self.pool, req, self.teams, team, candidates, usage)
        if not victims:
            return
        released = {h.id: self.pool.release(h.id) for h in victims}
        reclaim_id = uuid.uuid4().hex
        try:
            placement = self.pool.allocate(reclaim_id, req)
        except Exception:  # cannot happen (choose_victims checked it); never lose the victims' GPUs
            for alloc_id, p in released.items():
                self.pool.restore(alloc_id, p)
            log.exception("Reclaim for %s/%s failed to place after choosing victims", user, server)
            return
        grace = timedelta(seconds=self.settings.preempt_grace)
        records = {r.id: r for r in self.ledger.allocations.active()}
        rc = Reclaim(id=reclaim_id, user=user, server=server, team=team, request=req,
                     requested_models=requested_models, placement=placement,
                     victims=[records[h.id] for h in victims], created_at=now, deadline=now + grace,
                     expires=now + grace + timedelta(seconds=300), last_asked=now)
        self.active[(user, server)] = rc
        for v in rc.victims:
            self.warnings[v.user] = CullWarning(
                "server", f"your borrowed GPUs on {v.node} (server {v.server or 'default'}) are reclaimed for "
                f"team {team}, which is within its quota; the server stops at the deadline", rc.deadline)
            self.cache.forget(v.user)
        log.warning("Reclaiming %s for %s/%s (team %s): preempting %s at %s", self.pool.describe(placement), user,
                    server, team, ", ".join(f"{v.user}/{v.server or '-'}" for v in rc.victims), iso(rc.deadline))
        if self.on_reclaim is not None:
            self.on_reclaim(rc)
        raise self.refusal(rc)

    def refusal(self, rc: Reclaim) -> Refused:
        rc.last_asked = self.clock()
        n = sum(len(v.gpus) for v in rc.victims)
        return Refused(
            RefusalReason.RECLAIMING,
            f"Waiting for borrowed GPUs to be reclaimed for your team {rc.team}: "
            f"{plural(len(rc.victims), 'borrowed server')} of teams over their quota ({plural(n, 'GPU')}) "
            f"{'is' if len(rc.victims) == 1 else 'are'} stopped at {when_text(rc.deadline, self.settings.tz)}, "
            f"then your server starts on {self.pool.describe(rc.placement)}.",
            retry_at=max(rc.deadline, self.clock() + timedelta(seconds=1)),
            details={"team": rc.team, "node": rc.placement.node,
                     "victims": [{"user": v.user, "server": v.server} for v in rc.victims]})

    def claim(self, rc: Reclaim) -> Reclaim:
        """The spawner's retry of a reclaiming request: the reservation, once the victims are gone."""
        if not rc.ready:
            raise self.refusal(rc)
        del self.active[(rc.user, rc.server)]
        return rc

    @writes
    def preempt(self, rc: Reclaim, victim: AllocationRecord, *, stopped: bool = True, error: str | None = None) -> None:
        """A victim's server was stopped (or could not be): release its allocation, audit it.

        The debit from allocation records stops at the release time, so the victim pays
        exactly for the time it ran."""
        if victim.id in rc.done:
            return
        now = self.clock()
        reason = f"preempted: borrowed GPUs reclaimed for team {rc.team} ({rc.user}/{rc.server or '-'})"
        self.ledger.allocations.release(victim.id, at=now, reason=reason)
        rc.done.add(victim.id)
        self.cache.forget(victim.user)
        vteam = victim.request.get("team") or self.teams.default_team
        self.cooldown_until[vteam] = now + timedelta(seconds=self.settings.preempt_cooldown)
        self.preemptions[vteam] = self.preemptions.get(vteam, 0) + 1
        self.victim_cooldown_until[(victim.user, victim.server)] = (
            now + timedelta(seconds=self.settings.preempt_cooldown))
        if not any(v.user == victim.user and v.id not in r.done for r in self.active.values() for v in r.victims):
            self.warnings.pop(victim.user, None)
        detail = {"allocation": victim.id, "team": vteam, "for_team": rc.team, "for_user": rc.user,
                  "for_server": rc.server, "node": victim.node, "gpus": len(victim.gpus), "stopped": stopped}
        if error:
            detail["error"] = error
        event = AuditEvent(now, victim.user, victim.server, AuditAction.PREEMPT.value, reason, False, detail)
        if self.witnesses is None:
            self.ledger.audit.add(event)
        else:
            self.witnesses.record(event)
            self.witnesses.gpus_taken(victim.user, victim.server, now)
        log.warning("Preempted %s/%s (team %s) for %s/%s (team %s)%s", victim.user, victim.server or "-", vteam,
                    rc.user, rc.server or "-", rc.team, f": stop failed: {error}" if error else "")

    def cancel(self, rc: Reclaim, why: str) -> None:
        self.active.pop((rc.user, rc.server), None)
        if rc.id in self.pool:
            self.pool.release(rc.id)
        for v in rc.victims:  # victims not stopped yet get their GPUs back
            if v.id not in rc.done and v.id not in self.pool:
                held = self.ledger.allocations.get(v.id)
                if held is not None and held.released_at is None:
                    try:
                        self.pool.restore(v.id, self.inventory.placement_of(v))
                    except Exception as e:
                        log.error("Cannot give %s back to %s after a cancelled reclaim: %s", v.id, v.user, e)
            self.warnings.pop(v.user, None)
            self.cache.forget(v.user)
        log.info("Reclaim for %s/%s dropped: %s", rc.user, rc.server, why)

    @writes
    def cancel_pending(self, user: str, server: str, why: str) -> bool:
        """The spawn waiting for a reclaim is gone (stopped, timed out): drop the reclaim
        now, so its victims not yet stopped keep their GPUs. False if there was none."""
        rc = self.active.get((user, server))
        if rc is None:
            return False
        self.cancel(rc, why)
        return True

    @writes
    def expire(self) -> None:
        """Drop reclaims never claimed after their grace + 5 minutes, and those whose
        requester stopped asking (``ABANDONED_AFTER``) before their victims are stopped."""
        now = self.clock()
        for rc in list(self.active.values()):
            if now >= rc.expires:
                self.cancel(rc, "not claimed in time")
            elif not rc.ready and rc.last_asked is not None and now - rc.last_asked >= ABANDONED_AFTER:
                self.cancel(rc, f"the spawn stopped asking for it {int((now - rc.last_asked).total_seconds())} s ago")

    def restore(self, preempts: list[AuditEvent], held: list[AllocationRecord]) -> int:
        """At start-up: cool-downs and counters from the ``preempt`` audit events (oldest
        first), and the borrowed mark of held servers recomputed against the current
        quotas, oldest server first (a quota lowered while they ran turns the newest
        into borrowed ones). Returns how many servers were re-classified."""
        cooldown = timedelta(seconds=self.settings.preempt_cooldown)
        for e in preempts:
            team = (e.detail or {}).get("team") or self.teams.default_team
            self.preemptions[team] = self.preemptions.get(team, 0) + 1
            self.cooldown_until[team] = max(self.cooldown_until.get(team, e.at), e.at + cooldown)
            self.victim_cooldown_until[(e.user, e.server)] = e.at + cooldown
        if not self.teams.enabled:
            return 0
        changed = 0
        so_far: list[fairshare.Holding] = []
        for r in sorted(held, key=lambda r: (r.created_at, r.id)):
            team = r.request.get("team") or self.teams.default_team
            milli = sum(g["milli"] for g in r.gpus)
            model = r.gpus[0]["model"] if r.gpus else ""
            borrowed = self.teams.classify(team, milli, model, self.teams.usage(so_far)) == "borrowed"
            if borrowed != r.borrowed:
                self.ledger.allocations.set_borrowed(r.id, borrowed)
                changed += 1
                log.warning("%s/%s (team %s) is now %s under the current quotas", r.user, r.server or "-", team,
                            "borrowed" if borrowed else "guaranteed")
            so_far.append(fairshare.Holding(id=r.id, team=team, milli=milli, model=model, borrowed=borrowed,
                                            created_at=r.created_at, node=r.node, user=r.user, server=r.server))
        return changed
