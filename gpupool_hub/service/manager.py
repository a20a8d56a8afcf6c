"""The pool manager: money and GPUs, one authority, no HTTP.

Handlers and jobs call this; it combines the pure core (pricing, credits,
placement) with the ledger. Everything that changes the placement pool runs
on the service's event-loop thread, so admission decisions never race; the
debit and replenish jobs only touch the ledger and may run in a worker thread.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from ..config import GPUPool
from .. import fairshare
from ..credits import affordable_at, balance_status, can_start, due_credits, next_credit_times
from ..keys import entry_key
from ..ledger import AllocationRecord, AuditEvent, Ledger, Posting, UnknownAccount, utcnow
from ..placement.errors import InvalidRequest, ModelUnavailable, NoCapacity
from ..placement.request import Request, normalize_model
from ..placement.state import GPUShare, Placement, Pool
from ..pricing import PriceTable, PricingError, model_matches
from ..units import format_tokens, round_milli
from ..usage import UsageSource, UsageUnavailable

log = logging.getLogger("gpupool.manager")

DEBIT_JOB = "debit"


class Refused(Exception):
    """An allocation request the pool says no to, with a reason a machine and a person can read."""

    def __init__(self, reason: str, message: str, *, retry_at: datetime | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_at = retry_at
        self.details = dict(details or {})

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "message": self.message,
            "retry_at": _iso(self.retry_at),
            "details": self.details,
        }


class BadRequest(ValueError):
    """Input that can never be valid; the API answers 400 with this message."""


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _align_down(t: datetime, seconds: int) -> datetime:
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, timezone.utc)


def parse_request(body: Any) -> Request:
    """A placement request from JSON, with messages that name the bad field."""
    if not isinstance(body, Mapping):
        raise BadRequest("request must be a JSON object")
    allowed = {"gpus", "gpu_milli", "gpu_fraction", "models", "cpu_milli", "memory_mib"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown request field(s) {unknown}; expected some of {sorted(allowed)}")
    gpu_milli = body.get("gpu_milli", 0)
    if "gpu_fraction" in body:
        fraction = body["gpu_fraction"]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float, str)):
            raise BadRequest(f"gpu_fraction must be a number between 0 and 1, got {fraction!r}")
        try:
            value = Decimal(str(fraction))
        except Exception:
            raise BadRequest(f"gpu_fraction must be a number between 0 and 1, got {fraction!r}") from None
        if not value.is_finite() or not 0 < value < 1 or (value * 1000) % 1:
            raise BadRequest(f"gpu_fraction must be between 0 and 1 with at most 3 decimals, got {fraction!r}")
        gpu_milli = int(value * 1000)
    models = body.get("models")
    if models is not None and (
        not isinstance(models, list) or not models or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        raise BadRequest(f"models must be a non-empty list of GPU model names, got {models!r}")
    try:
        return Request(
            cpu_milli=body.get("cpu_milli", 0), memory_mib=body.get("memory_mib", 0),
            gpus=body.get("gpus", 0), gpu_milli=gpu_milli,
            models=frozenset(models) if models else None,
        )
    except InvalidRequest as e:
        raise BadRequest(str(e)) from None


@dataclass
class DebitStatus:
    """What the last debit attempt said; shown as "accounting delayed" when stuck."""

    last_error: str | None = None
    failing_since: datetime | None = None
    last_attempt: datetime | None = None


@dataclass
class CullWarning:
    action: str  # "kernels" | "server"
    reason: str
    deadline: datetime

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason, "deadline": _iso(self.deadline)}


@dataclass
class Reclaim:
    """Borrowed servers being preempted so that (user, server) can start within its quota.

    The requester's GPUs are reserved in the placement pool at once (``alloc_id``,
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

    @property
    def ready(self) -> bool:
        return all(v.id in self.done for v in self.victims)

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.user, "server": self.server, "team": self.team, "node": self.placement.node,
                "deadline": _iso(self.deadline), "ready": self.ready,
                "victims": [{"allocation": v.id, "user": v.user, "server": v.server,
                             "team": v.request.get("team"), "released": v.id in self.done} for v in self.victims]}


@dataclass
class PoolManager:
    settings: GPUPool
    ledger: Ledger
    pool: Pool
    usage_source: UsageSource
    debit_interval: int = 3600
    debit_delay_tolerance: int = 900
    clock: Callable[[], datetime] = utcnow
    debit_status: DebitStatus = field(default_factory=DebitStatus)
    cull_warnings: dict[str, CullWarning] = field(default_factory=dict)
    # refusals for lack of capacity, newest last (pressure signal for culling)
    capacity_refusals: list[datetime] = field(default_factory=list)
    # users whose GPU processes the node agents stop, and servers whose GPUs were taken back
    enforce_users: set[str] = field(default_factory=set)
    revoked: dict[tuple[str, str], datetime] = field(default_factory=dict)
    # team fair share: reclaims in progress per requesting (user, server), the warnings
    # their victims see in GET me, and until when a preempted team may not preempt
    reclaims: dict[tuple[str, str], Reclaim] = field(default_factory=dict)
    preempt_warnings: dict[str, CullWarning] = field(default_factory=dict)
    preempt_cooldown_until: dict[str, datetime] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)  # per victim team, since start
    # called with a new Reclaim; the service stops the victims' servers after the grace
    # and calls preempt() for each (without it, callers do that themselves)
    on_reclaim: Callable[[Reclaim], None] | None = None

    def __post_init__(self) -> None:
        self.teams = self.settings.team_table()
        self.prices: PriceTable = self.settings.price_table()
        self.prices.check_models(self.pool_models())
        self._debit_lock = threading.Lock()
        self._me_cache: dict[str, tuple[tuple[frozenset[str], Any], dict[str, Any]]] = {}
        self._generation = 0
        self._clock_cache: tuple[int, int, dict[str, Any]] | None = None
        self._last_debit: tuple[tuple[datetime, datetime] | None] | None = None

    # ------------------------------------------------------------ inventory

    def pool_models(self) -> set[str]:
        return {g.model for ns in self.pool.nodes for g in ns.node.gpus}

    def resolve_models(self, names: Iterable[str] | None) -> frozenset[str] | None:
        """Turn profile names ("RTX 3090") into the pool's reported model strings."""
        if names is None:
            return None
        models = self.pool_models()
        out = {m for m in models for name in names if model_matches(name, m) or name.lower() == m.lower()}
        if not out:
            raise Refused(
                "model_unavailable",
                f"No GPU of model {' or '.join(sorted(names))} exists in this pool; "
                f"available models: {', '.join(sorted(models)) or 'none'}.",
                details={"requested": sorted(names), "available": sorted(models)},
            )
        return frozenset(out)

    def catalog(self) -> dict[str, Any]:
        """Per pool GPU model: price per GPU-hour, GPUs in the pool and whole GPUs free."""
        free = self.pool.free_summary().per_model
        counts: dict[str, int] = {}
        for ns in self.pool.nodes:
            for g in ns.node.gpus:
                counts[g.model] = counts.get(g.model, 0) + 1
        models = []
        for model in sorted(counts):
            try:
                price = format_tokens(self.prices.price_per_gpu_hour(model))
            except PricingError:
                price = None
            e = free.get(model, {})
            models.append({"model": model, "price_per_gpu_hour": price, "gpus": counts[model],
                           "whole_free": e.get("whole_free", 0),
                           "largest_whole_block": e.get("largest_whole_block", 0)})
        return {"models": models, "min_start_hours": format_tokens(self.settings.min_start_hours)}

    def restore(self) -> int:
        """Rebuild the placement pool from the allocations the ledger says are held."""
        restored = 0
        for record in self.ledger.active_allocations():
            placement = Placement(
                node=record.node,
                gpus=tuple(GPUShare(g["index"], g["uuid"], g["model"], g["milli"], g.get("mig_uuid")) for g in record.gpus),
                cpu_milli=record.request.get("cpu_milli", 0),
                memory_mib=record.request.get("memory_mib", 0),
            )
            try:
                self.pool.restore(record.id, placement)
                restored += 1
            except Exception as e:  # the node left the inventory, or a conflict: release, loudly
                log.error("Releasing allocation %s of %s: cannot restore it (%s)", record.id, record.user, e)
                self.ledger.release_allocation(record.id, at=self.clock(), reason=f"not restorable: {e}")
        return restored

    # ------------------------------------------------------------- accounts

    def ensure_account(self, user: str, groups: Iterable[str] = ()) -> bool:
        """Open the account and post the credits due (the initial grant for a new user).

        Returns whether anything was posted."""
        now = self.clock()
        rules = self.settings.rules_for(set(groups))
        try:
            through = self.ledger.account(user).credits_through
        except UnknownAccount:
            through = None
        today = now.astimezone(self.settings.tz).date()
        if through is not None and through >= today:
            return False
        due = due_credits(user, rules, through, now, self.settings.tz)
        self.ledger.apply_credits(user, due, through=today, max_balance=rules.max_balance, now=now)
        self.forget(user)
        return True

    # The "me" view is read far more often than it changes (every lab tab polls
    # it), so its ledger-derived part is cached per user and dropped whenever
    # this service, the ledger's only writer, changes that user's account.
    # Writers in the job thread bump the generation, so a view computed while
    # they committed is never stored.

    def forget(self, user: str | None = None) -> None:
        if user is None:
            self._generation += 1
            self._me_cache.clear()
        else:
            self._me_cache.pop(user, None)

    def replenish(self, users: Iterable[tuple[str, Iterable[str]]]) -> int:
        """Credits for every (user, groups) pair; returns how many users were looked at."""
        n = 0
        posted = False
        for user, groups in users:
            posted |= self.ensure_account(user, groups)
            n += 1
        if posted:
            self.forget()
        return n

    def grant(self, user: str, amount: Decimal, reason: str, actor: str, idempotency_key: str | None) -> tuple[Any, bool]:
        kind = "grant" if amount > 0 else "adjustment"
        key = entry_key("api-grant", user, idempotency_key) if idempotency_key else entry_key("api-grant", user, uuid.uuid4().hex)
        posted = self.ledger.post(Posting(user, kind, amount, key, reason=reason, actor=actor))
        self.forget(user)
        return posted.entry, posted.created

    # ----------------------------------------------------------- admission

    def price_of(self, placement: Placement) -> Decimal:
        return sum((self.prices.price_per_gpu_hour(g.model) * Decimal(g.milli) / 1000 for g in placement.gpus), Decimal(0))

    def admit(self, user: str, groups: Iterable[str], server: str, request: Request,
              requested_models: list[str] | None = None) -> AllocationRecord:
        """Place a server's GPUs if the user can pay and the pool has room; else ``Refused``.

        A second request for the same (user, server) while one is held returns
        the held allocation: spawners retry, and a retry must not take more GPUs.
        """
        for record in self.ledger.active_allocations(user):
            if record.server == server:
                return record
        self.expire_reclaims()
        if request.total_gpu_milli == 0:
            raise BadRequest("a request without GPUs needs no allocation")
        groups = set(groups)
        self.ensure_account(user, groups)
        rules = self.settings.rules_for(groups)
        balance = self.ledger.balance(user)
        allowed = self.resolve_models(requested_models) if requested_models else frozenset(self.pool_models())
        gpus = Decimal(request.total_gpu_milli) / 1000
        price = {m: self.prices.price_per_hour(m, gpus) for m in allowed}
        affordable = frozenset(m for m in allowed if can_start(balance, price[m], rules, self.settings.min_start_hours))
        if not affordable:
            cheapest = min(price.values())
            when = affordable_at(balance, cheapest, rules, self.clock(), self.settings.tz, self.settings.min_start_hours)
            need = cheapest * self.settings.min_start_hours
            msg = (
                f"Not enough tokens: your balance is {balance:.1f} and this server costs {cheapest:g} tokens/h; "
                f"starting needs {need:g} tokens for {self.settings.min_start_hours:g} h without going below "
                f"the floor of {rules.floor:g}."
            )
            msg += (f" With the daily credits you can start it from {when:%Y-%m-%d %H:%M %Z}." if when
                    else " No scheduled credit makes it affordable; ask an admin for a grant.")
            raise Refused("insufficient_balance", msg, retry_at=when, details={
                "balance": format_tokens(balance), "price_per_hour": format_tokens(cheapest),
                "floor": format_tokens(rules.floor)})
        req = Request(cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, gpus=request.gpus,
                      gpu_milli=request.gpu_milli, models=affordable)
        team, usage, holdings = None, None, []
        if self.teams.enabled:
            pending = self.reclaims.get((user, server))
            if pending is not None:
                if self._same_shape(pending.request, req):
                    return self._claim(pending, requested_models)
                self.cancel_reclaim(pending, "the request changed")
            holdings = self.holdings()
            usage = self.teams.usage(holdings)
            team = self.teams.resolve(groups, usage)
        alloc_id = uuid.uuid4().hex
        try:
            placement = self.pool.allocate(alloc_id, req)
        except ModelUnavailable as e:
            raise Refused("model_unavailable", f"This pool can never place {request.describe()}: {e}",
                          details={"available": sorted(self.pool_models())}) from None
        except NoCapacity:
            self.capacity_refusals.append(self.clock())
            if team is not None and usage is not None:
                self._try_reclaim(user, server, team, usage, holdings, req, requested_models)
            free = self.pool.free_summary()
            raise Refused("no_capacity",
                          f"No capacity for {request.describe()} right now. Free now: {free}. "
                          "Try again when other servers stop, or pick a smaller profile.",
                          details={"free": free.as_dict()}) from None
        return self._record(alloc_id, user, server, request, requested_models, placement, team, usage)

    def _record(self, alloc_id: str, user: str, server: str, request: Request, requested_models: list[str] | None,
                placement: Placement, team: str | None, usage: fairshare.Usage | None) -> AllocationRecord:
        borrowed = False
        stored = {"cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib, "gpus": request.gpus,
                  "gpu_milli": request.gpu_milli, "models": sorted(requested_models or [])}
        if team is not None and usage is not None:
            model = placement.gpus[0].model if placement.gpus else ""
            borrowed = self.teams.classify(team, placement.gpu_milli, model, usage) == "borrowed"
            stored["team"] = team
        record = AllocationRecord(
            id=alloc_id, user=user, server=server, node=placement.node,
            gpus=tuple({"index": g.index, "uuid": g.uuid, "model": g.model, "milli": g.milli, "mig_uuid": g.mig_uuid}
                       for g in placement.gpus),
            request=stored,
            price_per_hour=round_milli(self.price_of(placement)), borrowed=borrowed, created_at=self.clock(),
        )
        try:
            self.ledger.add_allocation(record)
        except Exception:
            self.pool.release(alloc_id)
            raise
        self.forget(user)
        log.info("Allocated %s to %s/%s: %s", alloc_id, user, server, self.pool.describe(placement))
        return record

    def release(self, alloc_id: str, reason: str) -> AllocationRecord | None:
        record = self.ledger.release_allocation(alloc_id, at=self.clock(), reason=reason)
        if alloc_id in self.pool:
            self.pool.release(alloc_id)
        if record is not None:
            self.forget(record.user)
        return record

    # ---------------------------------------------------------- fair share

    def holdings(self, exclude: str | None = None) -> list[fairshare.Holding]:
        """What each team holds, as admission sees it: active allocations with their team
        (older ones without a team: the default team), minus servers being preempted,
        plus GPUs reserved for a reclaim (they count for the team they are reserved for)."""
        leaving = {v.id for rc in self.reclaims.values() for v in rc.victims}
        out = []
        for r in self.ledger.active_allocations():
            if r.id in leaving:
                continue
            out.append(fairshare.Holding(
                id=r.id, team=r.request.get("team") or self.teams.default_team,
                milli=sum(g["milli"] for g in r.gpus), model=r.gpus[0]["model"] if r.gpus else "",
                borrowed=r.borrowed, created_at=r.created_at, node=r.node, user=r.user, server=r.server))
        for rc in self.reclaims.values():
            if rc.id != exclude:
                out.append(fairshare.Holding(
                    id=rc.id, team=rc.team, milli=rc.placement.gpu_milli,
                    model=rc.placement.gpus[0].model if rc.placement.gpus else "", borrowed=False,
                    created_at=rc.created_at, node=rc.placement.node, user=rc.user, server=rc.server))
        return out

    def team_report(self) -> dict[str, Any]:
        holdings = self.holdings()
        now = self.clock()
        teams = self.teams.report(holdings) if self.teams.enabled else []
        for t in teams:
            until = self.preempt_cooldown_until.get(t["team"])
            t["preempted"] = self.preemptions.get(t["team"], 0)
            t["cooldown_until"] = _iso(until) if until and until > now else None
        return {"enabled": self.teams.enabled, "default_team": self.teams.default_team,
                "preempt_grace_seconds": self.settings.preempt_grace, "teams": teams,
                "reclaims": [rc.as_dict() for rc in self.reclaims.values()]}

    def _try_reclaim(self, user: str, server: str, team: str, usage: fairshare.Usage,
                     holdings: list[fairshare.Holding], req: Request, requested_models: list[str] | None) -> None:
        """No room: if the request is within its team's quota and borrowed GPUs of teams
        over quota would make it fit, reserve the GPUs, warn the victims and raise
        ``Refused("reclaiming")``. Returns when there is nothing to reclaim."""
        now = self.clock()
        models = {g.model for ns in self.pool.nodes for g in ns.node.gpus
                  if req.models is None or normalize_model(g.model) in req.models}
        if not fairshare.may_preempt(self.teams, team, req.total_gpu_milli, usage, now,
                                     self.preempt_cooldown_until, models):
            return
        if self.teams.quota(team).models:  # place only on models still within the team's quota
            ok = [m for m in models if self.teams.within_quota(team, req.total_gpu_milli, usage, m)]
            req = Request(cpu_milli=req.cpu_milli, memory_mib=req.memory_mib, gpus=req.gpus,
                          gpu_milli=req.gpu_milli, models=frozenset(ok))
        victims = fairshare.choose_victims(self.pool, req, self.teams, team, holdings, usage)
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
        records = {r.id: r for r in self.ledger.active_allocations()}
        rc = Reclaim(id=reclaim_id, user=user, server=server, team=team, request=req,
                     requested_models=requested_models, placement=placement,
                     victims=[records[h.id] for h in victims], created_at=now, deadline=now + grace,
                     expires=now + grace + timedelta(seconds=300))
        self.reclaims[(user, server)] = rc
        for v in rc.victims:
            self.preempt_warnings[v.user] = CullWarning(
                "server", f"your borrowed GPUs on {v.node} (server {v.server or 'default'}) are reclaimed for "
                f"team {team}, which is within its quota; the server stops at the deadline", rc.deadline)
            self.forget(v.user)
        log.warning("Reclaiming %s for %s/%s (team %s): preempting %s at %s", self.pool.describe(placement), user,
                    server, team, ", ".join(f"{v.user}/{v.server or '-'}" for v in rc.victims), _iso(rc.deadline))
        if self.on_reclaim is not None:
            self.on_reclaim(rc)
        raise self._reclaiming(rc)

    def _reclaiming(self, rc: Reclaim) -> Refused:
        n = sum(len(v.gpus) for v in rc.victims)
        return Refused(
            "reclaiming",
            f"Waiting for borrowed GPUs to be reclaimed for your team {rc.team}: {len(rc.victims)} borrowed "
            f"server(s) of teams over their quota ({n} GPU(s)) are stopped at {_iso(rc.deadline)}, "
            f"then your server starts on {self.pool.describe(rc.placement)}.",
            retry_at=max(rc.deadline, self.clock() + timedelta(seconds=1)),
            details={"team": rc.team, "node": rc.placement.node,
                     "victims": [{"user": v.user, "server": v.server} for v in rc.victims]})

    @staticmethod
    def _same_shape(a: Request, b: Request) -> bool:
        return (a.cpu_milli, a.memory_mib, a.gpus, a.gpu_milli) == (b.cpu_milli, b.memory_mib, b.gpus, b.gpu_milli)

    def _claim(self, rc: Reclaim, requested_models: list[str] | None) -> AllocationRecord:
        """The spawner's retry of a reclaiming request: the reserved GPUs once the victims are gone."""
        if not rc.ready:
            raise self._reclaiming(rc)
        usage = self.teams.usage(self.holdings(exclude=rc.id))
        del self.reclaims[(rc.user, rc.server)]
        return self._record(rc.id, rc.user, rc.server, rc.request, requested_models, rc.placement, rc.team, usage)

    def preempt(self, rc: Reclaim, victim: AllocationRecord, *, stopped: bool = True, error: str | None = None) -> None:
        """A victim's server was stopped (or could not be): release its allocation, audit it.

        The debit from allocation records stops at the release time, so the victim pays
        exactly for the time it ran."""
        if victim.id in rc.done:
            return
        now = self.clock()
        reason = f"preempted: borrowed GPUs reclaimed for team {rc.team} ({rc.user}/{rc.server or '-'})"
        self.ledger.release_allocation(victim.id, at=now, reason=reason)
        rc.done.add(victim.id)
        self.forget(victim.user)
        vteam = victim.request.get("team") or self.teams.default_team
        self.preempt_cooldown_until[vteam] = now + timedelta(seconds=self.settings.preempt_cooldown)
        self.preemptions[vteam] = self.preemptions.get(vteam, 0) + 1
        if not any(v.user == victim.user and v.id not in r.done for r in self.reclaims.values() for v in r.victims):
            self.preempt_warnings.pop(victim.user, None)
        detail = {"allocation": victim.id, "team": vteam, "for_team": rc.team, "for_user": rc.user,
                  "for_server": rc.server, "node": victim.node, "gpus": len(victim.gpus), "stopped": stopped}
        if error:
            detail["error"] = error
        self.ledger.add_audit(AuditEvent(now, victim.user, victim.server, "preempt", reason, False, detail))
        log.warning("Preempted %s/%s (team %s) for %s/%s (team %s)%s", victim.user, victim.server or "-", vteam,
                    rc.user, rc.server or "-", rc.team, f": stop failed: {error}" if error else "")

    def cancel_reclaim(self, rc: Reclaim, why: str) -> None:
        self.reclaims.pop((rc.user, rc.server), None)
        if rc.id in self.pool:
            self.pool.release(rc.id)
        for v in rc.victims:  # victims not stopped yet get their GPUs back
            if v.id not in rc.done and v.id not in self.pool and self.ledger.allocation(v.id) is not None \
                    and self.ledger.allocation(v.id).released_at is None:  # type: ignore[union-attr]
                try:
                    self.pool.restore(v.id, self.pool_placement(v))
                except Exception as e:
                    log.error("Cannot give %s back to %s after a cancelled reclaim: %s", v.id, v.user, e)
            self.preempt_warnings.pop(v.user, None)
            self.forget(v.user)
        log.info("Reclaim for %s/%s dropped: %s", rc.user, rc.server, why)

    def expire_reclaims(self) -> None:
        now = self.clock()
        for rc in list(self.reclaims.values()):
            if now >= rc.expires:
                self.cancel_reclaim(rc, "not claimed in time")

    @staticmethod
    def pool_placement(record: AllocationRecord) -> Placement:
        return Placement(
            node=record.node,
            gpus=tuple(GPUShare(g["index"], g["uuid"], g["model"], g["milli"], g.get("mig_uuid")) for g in record.gpus),
            cpu_milli=record.request.get("cpu_milli", 0), memory_mib=record.request.get("memory_mib", 0))

    def describe(self, record: AllocationRecord) -> str:
        placement = Placement(record.node, tuple(GPUShare(g["index"], g["uuid"], g["model"], g["milli"], g.get("mig_uuid"))
                                                 for g in record.gpus))
        return f"{self.pool.describe(placement)}, {record.price_per_hour:g} tokens/h"

    def allocation_json(self, record: AllocationRecord) -> dict[str, Any]:
        return {
            "id": record.id, "user": record.user, "server": record.server, "node": record.node,
            "gpus": [{"index": g["index"], "uuid": g["uuid"], "model": g["model"],
                      "fraction": format_tokens(Decimal(g["milli"]) / 1000)} for g in record.gpus],
            "price_per_hour": format_tokens(record.price_per_hour), "borrowed": record.borrowed,
            "started_at": _iso(record.created_at), "released_at": _iso(record.released_at),
            "description": self.describe(record),
        }

    # ------------------------------------------------------------------ me

    def accounting_status(self) -> dict[str, Any]:
        status = self.debit_status
        now = self.clock()
        behind = self.next_interval_start() + timedelta(seconds=self.debit_interval + self.debit_delay_tolerance) < now
        if status.last_error and (behind or status.failing_since):
            return {"status": "delayed", "message": f"{status.last_error}; usage will be charged when it answers"}
        if behind:
            return {"status": "delayed", "message": "usage for past intervals has not been charged yet"}
        return {"status": "ok", "message": None}

    def me(self, user: str, groups: Iterable[str] = ()) -> dict[str, Any]:
        groups = frozenset(groups)
        today = self.clock().astimezone(self.settings.tz).date()
        cached = self._me_cache.get(user)
        if cached is None or cached[0] != (groups, today):
            generation = self._generation
            self.ensure_account(user, groups)
            view = self._account_view(user, groups)
            if generation == self._generation:
                self._me_cache[user] = ((groups, today), view)
        else:
            view = cached[1]
        warning = self.cull_warnings.get(user) or self.preempt_warnings.get(user)
        clock = self._clock_view()
        return {
            **view,
            "credits": {**view["credits"], **clock["credits"]},
            "last_debit_at": clock["last_debit_at"],
            "accounting": clock["accounting"],
            "cull_warning": warning.as_dict() if warning else None,
        }

    def _clock_view(self) -> dict[str, Any]:
        """The parts of ``me`` that depend only on the time, shared by every user for a second."""
        now = self.clock()
        second = int(now.timestamp())
        cached = self._clock_cache
        if cached is not None and cached[0] == second and cached[1] == self._generation:
            return cached[2]
        daily_at, monthly_at = next_credit_times(now, self.settings.tz)
        last = self.last_debit()
        view = {
            "credits": {"next_daily_at": _iso(daily_at), "next_monthly_at": _iso(monthly_at)},
            "last_debit_at": _iso(last[1]) if last else None,
            "accounting": self.accounting_status(),
        }
        self._clock_cache = (second, self._generation, view)
        return view

    def _account_view(self, user: str, groups: frozenset[str]) -> dict[str, Any]:
        """The part of ``me`` that only changes when the user's account does."""
        rules = self.settings.rules_for(groups)
        balance = self.ledger.balance(user)
        held = self.ledger.active_allocations(user)
        burn = sum((r.price_per_hour for r in held), Decimal(0))
        time_to_floor = int(max(Decimal(0), balance - rules.floor) / burn * 3600) if burn > 0 else None
        return {
            "user": user,
            "balance": format_tokens(balance),
            "floor": format_tokens(rules.floor),
            "unit": "tokens",
            "status": balance_status(balance, rules, self.settings.low_balance),
            "credits": {
                "daily": format_tokens(rules.daily), "monthly": format_tokens(rules.monthly),
                "max_balance": None if rules.max_balance is None else format_tokens(rules.max_balance),
            },
            "allocations": [self.allocation_json(r) for r in held],
            "burn_rate_per_hour": format_tokens(burn),
            "time_to_floor_seconds": time_to_floor,
        }

    def last_debit(self) -> tuple[datetime, datetime] | None:
        """The last charged interval, kept in memory (the debit job is its only writer)."""
        if self._last_debit is None:
            self._last_debit = (self.ledger.last_interval(DEBIT_JOB),)
        return self._last_debit[0]

    # --------------------------------------------------------------- debit

    def next_interval_start(self) -> datetime:
        last = self.last_debit()
        if last is not None:
            return last[1]
        return _align_down(self.ledger.epoch(self.clock()), self.debit_interval)

    def debit_due(self, *, max_intervals: int | None = None) -> int:
        """Charge every closed interval not yet charged, oldest first; stop at the first
        that the usage source cannot answer (it is retried on the next run).
        Returns the number of intervals charged.
        """
        with self._debit_lock:
            charged = 0
            while max_intervals is None or charged < max_intervals:
                start = self.next_interval_start()
                end = start + timedelta(seconds=self.debit_interval)
                now = self.clock()
                if end > now:
                    break
                self.debit_status.last_attempt = now
                try:
                    usage = self.usage_source.usage(start, end)
                    postings, carry = self._debit_postings(usage, start, end)
                except (UsageUnavailable, PricingError) as e:
                    if self.debit_status.failing_since is None:
                        self.debit_status.failing_since = now
                    self.debit_status.last_error = f"usage for {_iso(start)}–{_iso(end)} unavailable: {e}"
                    self._clock_cache = None
                    log.warning("Debit delayed: %s", self.debit_status.last_error)
                    break
                self.ledger.post_many(postings, complete_interval=(DEBIT_JOB, start, end), carry=carry)
                self._last_debit = ((start, end),)
                self.forget()
                self.debit_status.last_error = None
                self.debit_status.failing_since = None
                charged += 1
                log.info("Charged %s–%s: %d debit(s)", _iso(start), _iso(end), len(postings))
            return charged

    def _debit_postings(
        self, usage: Iterable[Any], start: datetime, end: datetime
    ) -> tuple[list[Posting], dict[tuple[str, str], Decimal]]:
        """Debits for one interval: each rounded to the milli-token with the remainder
        carried to the same user's next debit on that model, so totals stay exact."""
        carried = self.ledger.carries()
        postings, carry = [], {}
        for u in usage:
            exact = self.prices.cost(u.model, u.gpu_seconds) + carried.get((u.user, u.model), Decimal(0))
            cost = round_milli(exact)
            carry[(u.user, u.model)] = exact - cost
            if cost <= 0:
                continue
            hours = u.gpu_seconds / 3600
            postings.append(Posting(
                u.user, "debit", -cost, entry_key(DEBIT_JOB, u.user, u.model, start),
                reason=f"{hours.quantize(Decimal('0.001'))} GPU-h of {u.model}",
                interval_start=start, interval_end=end, model=u.model,
                gpu_seconds=u.gpu_seconds.quantize(Decimal("0.001")),
            ))
        return postings, carry
