"""Admission: may this server start, and on which GPUs?

Two questions, asked in order: which of the allowed GPU models can the user
afford (``affordable_models``), then where do the GPUs go (``place``). A
successful placement is recorded in the ledger as an allocation; releasing it
ends its charge. Everything that changes the placement pool runs on the
service's one writer thread (``threads.CoreThreads``), so admission decisions
never race.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from ... import fairshare
from ...config import GPUPool
from ...money.credits import CreditRules, affording_credit, can_start, start_need
from ...ledger import AllocationRecord, Ledger
from ...placement.errors import InvalidRequest, ModelUnavailable, NoCapacity
from ...placement.request import Request
from ...placement.state import Placement
from ...reasons import RefusalReason
from ...money.shortfall import shortfall_message
from ...timefmt import when_text
from ...money.units import format_tokens, round_milli
from .accounts import Accounts
from .attempts import AttemptAbandoned, Tombstones
from .enforcement import Enforcement
from .errors import BadRequest, Refused
from .pool_inventory import PoolInventory
from .queue import WaitQueue
from .reclaims import Reclaims
from .views import ViewCache
from .threads import CoreThreads, writes
from ...queue.order import BORROWER, UNDER_QUOTA

log = logging.getLogger("gpupool.admission")

REQUEST_FIELDS = frozenset({"gpus", "gpu_milli", "gpu_fraction", "mig", "models", "cpu_milli", "memory_mib",
                            "share"})


def parse_request(body: Any) -> Request:
    """A placement request from JSON, with messages that name the bad field."""
    if not isinstance(body, Mapping):
        raise BadRequest("request must be a JSON object")
    unknown = sorted(set(body) - REQUEST_FIELDS)
    if unknown:
        raise BadRequest(f"unknown request field(s) {unknown}; expected some of {sorted(REQUEST_FIELDS)}")
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
    mig = body.get("mig")
    if mig is not None and not isinstance(mig, str):
        raise BadRequest(f"mig must be a MIG profile name such as '1g.10gb', got {mig!r}")
    try:
        return Request(
            cpu_milli=body.get("cpu_milli", 0), memory_mib=body.get("memory_mib", 0),
            gpus=body.get("gpus", 0), gpu_milli=gpu_milli,
            models=frozenset(models) if models else None, mig=mig, share=body.get("share", ""),
        )
    except InvalidRequest as e:
        raise BadRequest(str(e)) from None


class Admission:
    """Prices, admits, records and releases allocations."""

    def __init__(self, settings: GPUPool, ledger: Ledger, inventory: PoolInventory, accounts: Accounts,
                 reclaims: Reclaims, enforcement: Enforcement, cache: ViewCache,
                 clock: Callable[[], datetime], queue: WaitQueue | None = None,
                 threads: CoreThreads | None = None) -> None:
        self.settings = settings
        self.queue = queue
        self.ledger = ledger
        self.inventory = inventory
        self.accounts = accounts
        self.reclaims = reclaims
        self.enforcement = enforcement
        self.cache = cache
        self.clock = clock
        self.threads = threads
        self.tombstones = Tombstones()  # keys of spawn attempts released by key (see attempts.py)

    @property
    def pool(self) -> Any:
        return self.inventory.pool

    def affordable_models(self, user: str, groups: Iterable[str], request: Request,
                          requested_models: list[str] | None,
                          held: list[AllocationRecord] | None = None) -> frozenset[str]:
        """The allowed pool models the user's balance covers; ``Refused`` if none.

        A new server starts only if the balance pays for *all* the user's servers,
        the held ones and this one, for ``min_start_hours`` without going below
        the floor: otherwise each server alone looks affordable and any number of
        them start at once (five 0.5 tokens/h servers at -9.4 with a floor of -10).
        """
        groups = set(groups)
        balance = self.accounts.balance_after_credits(user, groups)
        rules = self.settings.rules_for(groups)
        if held is None:
            held = self.ledger.allocations.active(user)
        held_price = sum((r.price_per_hour for r in held), Decimal(0))
        allowed = (self.inventory.resolve_models(requested_models) if requested_models
                   else frozenset(self.inventory.models()))
        if not allowed:  # inventory "agents" before any node's agent has reported
            raise Refused(RefusalReason.MODEL_UNAVAILABLE, "This pool has no GPU node yet.",
                          details={"requested": requested_models or [], "available": []})
        price = {m: self.inventory.request_price(m, request) for m in allowed}
        hours = self.settings.min_start_hours
        affordable = frozenset(m for m in price if can_start(balance, price[m], rules, hours, held_price))
        if affordable:
            return affordable
        raise self.insufficient(balance, min(price.values()), held, rules, hours)

    def insufficient(self, balance: Decimal, cheapest: Decimal, held: list[AllocationRecord], rules: CreditRules,
                     hours: Decimal) -> Refused:
        """The refusal for lack of tokens: what the start needs (``credits.start_need``, as the spawn
        form says it), what is held, and which credit makes it fit when; worded by ``shortfall``."""
        held_price = sum((r.price_per_hour for r in held), Decimal(0))
        found = affording_credit(balance, cheapest, rules, self.clock(), self.settings.tz, hours,
                                 held_per_hour=held_price)
        details = {
            "balance": format_tokens(balance), "price_per_hour": format_tokens(cheapest),
            "floor": format_tokens(rules.floor), "held_price_per_hour": format_tokens(held_price),
            "held": [{"server": r.server, "price_per_hour": format_tokens(r.price_per_hour)} for r in held],
            "needs": format_tokens(start_need(cheapest, held_price, hours)), "min_start_hours": format_tokens(hours),
            "credit": found.kind if found else None}
        when = found.at if found else None
        message = shortfall_message(details, when, lambda at: when_text(at, self.settings.tz))
        return Refused(RefusalReason.INSUFFICIENT_BALANCE, message, retry_at=when, details=details)

    @writes
    def admit(self, user: str, groups: Iterable[str], server: str, request: Request,
              requested_models: list[str] | None = None, key: str | None = None, *,
              pending: bool = False) -> AllocationRecord:
        """Place a server's GPUs if the user can pay and the pool has room; else ``Refused``.

        A second request for the same (user, server) while one is held returns
        the held allocation: spawners retry, and a retry must not take more GPUs.
        With a spawn attempt's ``key``: the same key gets the same allocation; a
        key released by key is refused (``AttemptAbandoned``); an allocation of
        the same server held under another key belongs to an earlier attempt
        whose release has not arrived, and is released before placing anew. ``pending``: the
        server's work has not started (a batch job about to be queued in its scheduler), so the
        allocation holds its GPUs uncharged until ``started`` says when it did.
        """
        if key is not None and key in self.tombstones:
            raise AttemptAbandoned(f"spawn attempt {key!r} was abandoned and its allocation released")
        held: list[AllocationRecord] | None = self.ledger.allocations.active(user)
        for record in list(held or ()):
            if record.server == server:
                if key is None or record.request.get("key") == key:
                    return record
                self.release(record.id, "superseded by a new spawn attempt of the same server")
                held = None  # read again below
        self.reclaims.expire()
        if request.total_gpu_milli == 0:
            raise BadRequest("a request without GPUs needs no allocation")
        groups = set(groups)
        affordable = self.affordable_models(user, groups, request, requested_models, held)
        req = dataclasses.replace(request, models=affordable)
        return self.place(user, groups, server, request, req, requested_models, key, pending=pending)

    def place(self, user: str, groups: set[str], server: str, request: Request, req: Request,
              requested_models: list[str] | None, key: str | None = None, *,
              pending: bool = False) -> AllocationRecord:
        """Find GPUs for ``req`` (models already narrowed to what the user affords)."""
        teams = self.reclaims.teams
        team, usage, holdings = None, None, []
        if teams.enabled:
            pending = self.reclaims.pending(user, server)
            if pending is not None:
                if pending.same_request(req, requested_models):
                    rc = self.reclaims.claim(pending)
                    usage = teams.usage(self.reclaims.holdings(exclude=rc.id))
                    return self.record(rc.id, user, server, rc.request, requested_models, rc.placement, rc.team,
                                       usage, key, pending=pending)
                self.reclaims.cancel(pending, "the request changed")
            holdings = self.reclaims.holdings()
            usage = teams.usage(holdings)
            team = teams.resolve(groups, usage)
        queue = self.queue
        if queue is not None:
            queue.expire()
            waited = self._from_queue(user, server, req, requested_models, team, usage)
            if waited is not None:
                return self.record(waited[0], user, server, request, requested_models, waited[1], team, usage, key, pending=pending)
        alloc_id = uuid.uuid4().hex
        try:
            placement = self.pool.allocate(alloc_id, req)
        except ModelUnavailable as e:
            raise Refused(RefusalReason.MODEL_UNAVAILABLE, f"This pool can never place {request.describe()}: {e}",
                          details={"available": sorted(self.inventory.models())}) from None
        except NoCapacity:
            self.enforcement.note_capacity_refusal(user, self.clock())
            if team is not None and usage is not None:
                self.reclaims.start(user, server, team, usage, holdings, req, requested_models)
            if queue is not None and queue.enabled_for(req):
                alloc_id, placement = queue.join(user, server, req, requested_models, self._priority(team, req, usage))
                return self.record(alloc_id, user, server, request, requested_models, placement, team, usage, key, pending=pending)
            free = self.pool.free_summary()
            raise Refused(RefusalReason.NO_CAPACITY,
                          f"No capacity for {request.describe()} right now. Free now: {free}."
                          f"{self.inventory.outside_note()} "
                          "Try again when other servers stop, or pick a smaller profile.",
                          details={"free": free.as_dict()}) from None
        return self.record(alloc_id, user, server, request, requested_models, placement, team, usage, key, pending=pending)

    def _from_queue(self, user: str, server: str, req: Request, requested_models: list[str] | None,
                    team: str | None, usage: fairshare.TeamUsage | None) -> tuple[str, Placement] | None:
        """The wait queue's say before placing: a queued (user, server) gets its reserved
        GPUs or its position (``Refused(QUEUED)``); while anyone waits, a newcomer joins
        the queue and starts only where backfill lets it. None: place as usual."""
        queue = self.queue
        assert queue is not None
        queue.check_cancelled(user, server, req, requested_models)
        entry = queue.pending(user, server)
        if entry is not None:
            got = queue.poll(entry, req, requested_models)
            if got is not None:
                return got
        priority = self._priority(team, req, usage)
        # while others wait, a newcomer joins behind them (a team within its quota tries its
        # reclaim first, on the usual path; a request that can never fit is refused there)
        if (queue.enabled_for(req) and queue.order.waiting_count() and priority == BORROWER
                and queue.could_fit(req)):
            self.enforcement.note_capacity_refusal(user, self.clock())
            return queue.join(user, server, req, requested_models, priority)
        return None

    def _priority(self, team: str | None, req: Request, usage: fairshare.TeamUsage | None) -> int:
        """Teams within their quota wait ahead of everyone else (then first come, first served)."""
        if team is not None and usage is not None and self.reclaims.teams.within_quota(team, req.total_gpu_milli,
                                                                                       usage):
            return UNDER_QUOTA
        return BORROWER

    def record(self, alloc_id: str, user: str, server: str, request: Request, requested_models: list[str] | None,
               placement: Placement, team: str | None, usage: fairshare.TeamUsage | None,
               key: str | None = None, *, pending: bool = False) -> AllocationRecord:
        """Write the allocation to the ledger (from now on it is charged, or once its work starts)."""
        borrowed = False
        stored: dict[str, Any] = {"cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib,
                                  "gpus": request.gpus, "gpu_milli": request.gpu_milli,
                                  "models": sorted(requested_models or [])}
        if request.mig:
            stored["mig"] = request.mig
        if key is not None:
            stored["key"] = key  # the spawn attempt's idempotency key
        if team is not None and usage is not None:
            model = placement.gpus[0].model if placement.gpus else ""
            borrowed = self.reclaims.teams.classify(team, placement.gpu_milli, model, usage) == "borrowed"
            stored["team"] = team
        record = AllocationRecord(
            id=alloc_id, user=user, server=server, node=placement.node,
            gpus=tuple({"index": g.index, "uuid": g.uuid, "model": g.model, "milli": g.milli, "mig_uuid": g.mig_uuid,
                        **({"mig_profile": g.mig_profile} if g.mig_profile else {}),
                        **({"share": request.share} if request.share and g.milli < 1000 else {})}
                       for g in placement.gpus),
            request=stored,
            price_per_hour=round_milli(self.inventory.price_of(placement, request.share)), borrowed=borrowed,
            created_at=(now := self.clock()), charged_from=None if pending else now,
        )
        try:
            self.ledger.allocations.add(record)
        except Exception:
            self.pool.release(alloc_id)
            raise
        self.cache.forget(user)
        log.info("Allocated %s to %s/%s: %s", alloc_id, user, server, self.pool.describe(placement))
        return record

    @writes
    def release(self, alloc_id: str, reason: str, at: datetime | None = None) -> AllocationRecord | None:
        """End an allocation: its charge stops now, or at ``at`` (when its server stopped, if
        the release comes late), kept within [its start, now]; its GPUs go back to the pool."""
        when = self.clock()
        if at is not None:
            held = self.ledger.allocations.get(alloc_id)
            if held is not None:
                when = min(max(at, held.created_at), when)
        record = self.ledger.allocations.release(alloc_id, at=when, reason=reason)
        if alloc_id in self.pool:
            self.pool.release(alloc_id)
            if self.queue is not None:
                if record is not None:
                    self.queue.freed(when, record.gpus)
                self.queue.dispatch()
        else:  # held outside the pool (its GPUs unknown to it): never to be taken back into it now
            self.inventory.forget(alloc_id)
        if record is not None:
            self.cache.forget(record.user)
        return record

    @writes
    def started(self, alloc_id: str, at: datetime) -> bool:
        """The server's work started at ``at`` (a batch job left its scheduler's queue): a pending
        allocation is charged from then, kept within [its creation, now]. Once: a repeat, or an
        allocation charged already, changes nothing (False)."""
        held = self.ledger.allocations.get(alloc_id)
        if held is None or held.released_at is not None or held.charged_from is not None:
            return False
        when = min(max(at, held.created_at), self.clock())
        done = self.ledger.allocations.start_charge(alloc_id, when)
        if done:
            log.info("Allocation %s of %s/%s charged from %s, when its work started", alloc_id, held.user,
                     held.server, when.isoformat())
            self.cache.forget(held.user)
        return done

    @writes
    def stopping(self, alloc_id: str) -> bool:
        """The hub stopped the server, and the engine has not confirmed its work ended: the allocation
        stays held and charged, shown as stopping (renewed while the hub keeps asking)."""
        held = self.ledger.allocations.get(alloc_id)
        done = self.ledger.allocations.ask_stop(alloc_id, self.clock())
        if done and held is not None and held.stop_asked_at is None:  # said once, not at every renewal
            self.cache.forget(held.user)
            log.warning("Allocation %s: its server was stopped but its work has not been seen to end; its GPUs "
                        "stay held (and charged) until it has", alloc_id)
        return done

    @writes
    def release_all(self, alloc_ids: list[str], reason: str) -> list[str]:
        """Release what a stopped server held (the cull job's); a no-op for allocations its
        spawner already released while stopping. Their ids, for the audit log."""
        for alloc_id in alloc_ids:
            self.release(alloc_id, reason)
        return alloc_ids

    @writes
    def release_key(self, key: str, reason: str) -> AllocationRecord | None:
        """Abandon a spawn attempt: release what its ``key`` got as never charged (at its start),
        and refuse the key's ``POST`` from now on (it may still be on its way)."""
        self.tombstones.add(key)
        for record in self.ledger.allocations.active():
            if record.request.get("key") == key:
                return self.release(record.id, reason, at=record.created_at)
        return None
