"""What users and the spawner read: the ``me`` view and allocation JSON.

The ``me`` view is read far more often than it changes (every lab tab polls
it), so its ledger-derived part is cached per user (``ViewCache``) and dropped
whenever this service, the ledger's only writer, changes that user's account.
Views are computed on reader threads while the writer thread changes accounts,
so each ``forget`` bumps a version (per user, or the generation for everyone)
and a view computed across a change is never stored.

``serve_me`` answers ``GET me`` without touching the writer unless it must: from
the cache on the event loop, else from the database on a reader thread, and on
the writer only when the account must be opened or credited first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from ...config import GPUPool
from ...money.credits import SCHEDULED, balance_status, floor_reached_at, next_credit_times
from ...ledger import AllocationRecord, Ledger
from ...placement.report import FreeSummary
from ...placement.state import Pool
from ...timefmt import iso
from ...money.units import format_tokens
from .accounts import Accounts
from .debits import Debits
from ...takeback.cull import CullWarning
from .pool_inventory import PoolInventory
from .catalog import catalog
from .threads import CoreThreads, reads, writes

ViewKey = tuple[frozenset[str], date]
T = TypeVar("T")

#: the cached view's balance, floor and held servers (price, start): ``_finish`` words when the
#: floor is reached from them at each answer's time, and leaves them out of the answer
FLOOR_BASIS = "_floor_basis"


class ViewCache:
    """The cached, ledger-derived part of each user's ``me`` view.

    Every unit that changes an account calls ``forget``. A view is stored only
    if nothing was forgotten for its user since ``token`` was taken before
    reading it (``store``), so a read racing a write never caches the old state."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[ViewKey, dict[str, Any]]] = {}
        self.generation = 0
        self.versions: dict[str, int] = {}
        self._lock = threading.Lock()

    def forget(self, user: str | None = None) -> None:
        with self._lock:
            if user is None:
                self.generation += 1
                self.entries.clear()
            else:
                self.versions[user] = self.versions.get(user, 0) + 1
                self.entries.pop(user, None)

    def token(self, user: str) -> tuple[int, int]:
        with self._lock:
            return self.generation, self.versions.get(user, 0)

    def get(self, user: str, key: ViewKey) -> dict[str, Any] | None:
        cached = self.entries.get(user)
        return cached[1] if cached is not None and cached[0] == key else None

    def store(self, user: str, key: ViewKey, view: dict[str, Any], token: tuple[int, int]) -> None:
        with self._lock:
            if token == (self.generation, self.versions.get(user, 0)):
                self.entries[user] = (key, view)


class UserParts(Protocol):
    """What ``GET me`` shows besides the account, from the units that hold it (the pool manager asks
    them): never cached, each changes on its own."""

    def warning_for(self, user: str) -> CullWarning | None:
        """The stop the user is warned of: a cull of their kernels, a preemption, an idle reclaim."""

    def activity(self, user: str, allocations: list[dict[str, Any]]) -> dict[str, Any]:
        """The user's GPUs as measured, with their idleness, and their servers waiting for GPUs."""

    def memory_warnings(self, user: str) -> list[dict[str, Any]]:
        """The memory guard's warnings for the user's servers."""

    def user_notices(self, user: str) -> list[dict[str, Any]]:
        """The take-back notices the user has not dismissed."""


class Views:
    """Builds and caches the read-side JSON; owns no money, only caches."""

    def __init__(self, settings: GPUPool, ledger: Ledger, inventory: PoolInventory, debits: Debits,
                 accounts: Accounts, cache: ViewCache, parts: UserParts, clock: Callable[[], datetime],
                 threads: CoreThreads) -> None:
        self.settings = settings
        self.ledger = ledger
        self.inventory = inventory
        self.debits = debits
        self.accounts = accounts
        self.cache = cache
        self.parts = parts  # warnings, GPUs as measured, idleness, queue places, notices: never cached
        self.clock = clock
        self.threads = threads
        self._clock_cache: tuple[int, int, int, dict[str, Any]] | None = None
        self._pool_views: dict[str, tuple[Pool, int, Any]] = {}  # _of_pool: what -> (pool, its changes, view)

    @writes
    def models(self) -> dict[str, Any]:
        """``GET pool/models``' catalog (writer thread: the pool lives there)."""
        return catalog(self.inventory, self.settings.min_start_hours)

    @writes
    def pool_snapshot(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Every node (or the nodes ``names``) and GPU with its holders, as the pool holds them
        now (writer thread)."""
        return self.inventory.pool.snapshot(names)

    @writes
    def free_summary(self) -> FreeSummary:
        """What is free now, per model (writer thread: the pool lives there), once per change
        of the pool (``_of_pool``)."""
        return self._of_pool("free", lambda pool: pool.free_summary())

    @writes
    def pool_summary(self) -> tuple[dict[str, dict[str, int]], dict[str, int], FreeSummary]:
        """The pool per model, each allocation's GPU share, and what is free: the admin pool
        map's summary of a large pool (writer thread: the pool lives there), one pass each,
        once per change of the pool (``_of_pool``)."""
        def summary(pool: Pool) -> tuple[dict[str, dict[str, int]], dict[str, int], FreeSummary]:
            per_model, by_alloc = pool.held_per_model()
            return per_model, by_alloc, pool.free_summary()

        return self._of_pool("summary", summary)

    def _of_pool(self, what: str, compute: Callable[[Pool], T]) -> T:
        """``compute(pool)``, kept until the pool allocates or releases (``Pool.changes``) or
        an inventory change replaces it: the admin pool map's summaries walk every GPU (10,000
        at 1,000 nodes) on the writer thread, and between two renders the pool mostly did not
        change. ``compute`` must read the pool alone (anything else it read would be kept past
        its own changes), and what is kept is shared by the renders: read it, never change it."""
        pool = self.inventory.pool
        kept = self._pool_views.get(what)
        if kept is None or kept[0] is not pool or kept[1] != pool.changes:
            kept = self._pool_views[what] = (pool, pool.changes, compute(pool))
        return kept[2]

    @writes
    def pool_report(self, active: Mapping[str, tuple[str, str, bool]], idle_since: dict[str, datetime],
                    utilization: dict[str, float] | None = None) -> dict[str, Any]:
        """``GET pool``'s nodes and free GPUs (writer thread: the pool lives there): each GPU
        and MIG instance with its holders (user, server, idle since, the server's own
        utilization), why a node agent cannot attribute a GPU's use, and what the inventory
        source holds outside the hub or reports unavailable. ``active``: each held allocation's
        (user, server, borrowed) by id (``ledger.allocations.active_holders``)."""
        own = utilization or {}
        inv = self.inventory
        nodes = inv.pool.snapshot()

        def holders(held: dict[str, int]) -> list[dict[str, Any]]:
            return [{"allocation": a, "fraction": format_tokens(Decimal(m) / 1000),
                     "user": active[a][0] if a in active else None,
                     "server": active[a][1] if a in active else None,
                     **({"idle_since": iso(idle_since[a])} if a in idle_since else {}),
                     **({"utilization": round(own[a], 4)} if a in own else {})}
                    for a, m in held.items()]

        for node in nodes:
            for gpu in node["gpus"]:
                gpu["allocated_fraction"] = format_tokens(Decimal(gpu.pop("allocated_milli")) / 1000)
                gpu["holders"] = holders(gpu["holders"])
                for instance in gpu.get("mig", ()):  # MIG instances inside their GPU, each with its holder
                    instance["fraction"] = format_tokens(Decimal(instance.pop("milli")) / 1000)
                    instance["holders"] = holders(instance["holders"])
        for node in nodes:  # placeholders of the inventory source (Slurm): not servers'
            node["held_outside"] = list(inv.held_outside.get(node["node"], []))
            if node["node"] in inv.unavailable:
                node["unavailable"] = inv.unavailable[node["node"]]
            if node["node"] in inv.problems:
                node["problem"] = inv.problems[node["node"]]
            report = inv.reports.get(node["node"])
            for gpu in node["gpus"]:
                if report is not None and gpu["uuid"] in report.unattributed:
                    gpu["cannot_attribute"] = report.unattributed[gpu["uuid"]]
                for h in gpu["holders"]:
                    if inv.is_outside(h["allocation"]):
                        h["held_outside"] = True
        return {"nodes": nodes, "free": inv.pool.free_summary().as_dict()}

    def allocation_json(self, record: AllocationRecord) -> dict[str, Any]:
        node = self.inventory.pool.by_name.get(record.node)
        memory = {g.uuid: g.memory_mib for g in node.node.gpus} if node is not None else {}
        return {
            "id": record.id, "user": record.user, "server": record.server, "node": record.node,
            "gpus": [{"index": g["index"], "uuid": g["uuid"], "model": g["model"],
                      "fraction": format_tokens(Decimal(g["milli"]) / 1000),
                      "memory_mib": memory.get(g["uuid"], 0),
                      **({"mig_uuid": g["mig_uuid"]} if g.get("mig_uuid") else {}),
                      **({"mig_profile": g["mig_profile"]} if g.get("mig_profile") else {}),
                      **({"share": g["share"]} if g.get("share") else {})} for g in record.gpus],
            "price_per_hour": format_tokens(record.price_per_hour), "borrowed": record.borrowed,
            "started_at": iso(record.created_at), "released_at": iso(record.released_at),
            "charged_from": iso(record.charged_from), "stopping_since": iso(record.stop_asked_at),
            "description": self.inventory.describe(record),
        }

    def _key(self, groups: frozenset[str]) -> ViewKey:
        return groups, self.clock().astimezone(self.settings.tz).date()

    async def serve_me(self, user: str, groups: Iterable[str] = ()) -> dict[str, Any]:
        """``GET me`` off the event loop: cache, else a reader thread, else the writer."""
        groups = frozenset(groups)
        return (self.cached_me(user, groups) or await self.read_me.off_loop(user, groups)
                or await self.me.off_loop(user, groups))

    def cached_me(self, user: str, groups: Iterable[str] = ()) -> dict[str, Any] | None:
        """The view from memory only, or None."""
        groups = frozenset(groups)
        view = self.cache.get(user, self._key(groups))
        return None if view is None else self._finish(user, view)

    @reads
    def read_me(self, user: str, groups: Iterable[str] = ()) -> dict[str, Any] | None:
        """The view from database reads only; None when the account must be written first."""
        groups = frozenset(groups)
        key = self._key(groups)
        token = self.cache.token(user)
        if not self.accounts.current(user):
            return None
        view = self._account_view(user, groups)
        self.cache.store(user, key, view, token)
        return self._finish(user, view)

    @writes
    def me(self, user: str, groups: Iterable[str] = ()) -> dict[str, Any]:
        """The view, opening and crediting the account first if needed (may write)."""
        groups = frozenset(groups)
        key = self._key(groups)
        view = self.cache.get(user, key)
        if view is None:
            self.accounts.ensure(user, groups)  # forgets the user: take the token after it
            token = self.cache.token(user)
            view = self._account_view(user, groups)
            self.cache.store(user, key, view, token)
        return self._finish(user, view)

    def _finish(self, user: str, view: dict[str, Any]) -> dict[str, Any]:
        """The cached part plus what changes without the account changing."""
        warning = self.parts.warning_for(user)
        clock = self._clock_view()
        basis = view[FLOOR_BASIS]
        now = self.clock()
        floor_at = floor_reached_at(*basis, self.debits.next_interval_start(), now)
        return {
            **{k: v for k, v in view.items() if k != FLOOR_BASIS},
            # from the balance the GPU time used so far leaves, not the last charged one
            "time_to_floor_seconds": None if floor_at is None else int((floor_at - now).total_seconds()),
            "floor_at": iso(floor_at),
            "credits": {**view["credits"], **clock["credits"]},
            "last_debit_at": clock["last_debit_at"],
            "accounting": clock["accounting"],
            "cull_warning": warning.as_dict() if warning else None,
            **self.parts.activity(user, view["allocations"]),
            "memory_warnings": self.parts.memory_warnings(user),
        }

    def _clock_view(self) -> dict[str, Any]:
        """The parts of ``me`` that depend only on the time, shared by every user for a second."""
        now = self.clock()
        second = int(now.timestamp())
        cached = self._clock_cache
        if cached is not None and cached[:3] == (second, self.cache.generation, self.debits.changed):
            return cached[3]
        times = dict(zip((k.next_at for k in SCHEDULED), next_credit_times(now, self.settings.tz)))
        last = self.debits.last_debit()
        view = {
            "credits": {key: iso(at) for key, at in times.items()},
            "last_debit_at": iso(last[1]) if last else None,
            "accounting": self.debits.accounting_status(),
        }
        self._clock_cache = (second, self.cache.generation, self.debits.changed, view)
        return view

    def _account_view(self, user: str, groups: frozenset[str]) -> dict[str, Any]:
        """The part of ``me`` that only changes when the user's account does."""
        rules = self.settings.rules_for(groups)
        balance = self.ledger.balance(user)
        held = self.ledger.allocations.active(user)
        burn = sum((r.price_per_hour for r in held), Decimal(0))
        return {
            # what is charging, from when (a pending batch job is not): the floor stop counts it
            FLOOR_BASIS: (balance, rules.floor, [(r.price_per_hour, r.charged_from) for r in held
                                                 if r.charged_from is not None]),
            "user": user,
            "balance": format_tokens(balance),
            "floor": format_tokens(rules.floor),
            "unit": "tokens",
            "status": balance_status(balance, rules, self.settings.low_balance),
            "credits": {
                **{k.name: format_tokens(getattr(rules, k.name)) for k in SCHEDULED},
                "max_balance": None if rules.max_balance is None else format_tokens(rules.max_balance),
            },
            "allocations": [self.allocation_json(r) for r in held],
            "burn_rate_per_hour": format_tokens(burn),
            "notices": self.parts.user_notices(user),
        }
