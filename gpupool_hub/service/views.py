"""What users and the spawner read: the ``me`` view and allocation JSON.

The ``me`` view is read far more often than it changes (every lab tab polls
it), so its ledger-derived part is cached per user (``ViewCache``) and dropped
whenever this service, the ledger's only writer, changes that user's account.
Writers in the job thread bump the generation, so a view computed while they
committed is never stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..config import GPUPool
from ..credits import balance_status, next_credit_times
from ..ledger import AllocationRecord, Ledger
from ..timefmt import iso
from ..units import format_tokens
from .accounts import Accounts
from .debits import Debits
from .enforcement import CullWarning
from .inventory import PoolInventory


class ViewCache:
    """The cached, ledger-derived part of each user's ``me`` view.

    Every unit that changes an account calls ``forget``; a job-thread writer
    that changes many accounts forgets everyone, which bumps the generation."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[tuple[frozenset[str], Any], dict[str, Any]]] = {}
        self.generation = 0

    def forget(self, user: str | None = None) -> None:
        if user is None:
            self.generation += 1
            self.entries.clear()
        else:
            self.entries.pop(user, None)


class Views:
    """Builds and caches the read-side JSON; owns no money, only caches."""

    def __init__(self, settings: GPUPool, ledger: Ledger, inventory: PoolInventory, debits: Debits,
                 accounts: Accounts, cache: ViewCache, warning_for: Callable[[str], CullWarning | None],
                 clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.ledger = ledger
        self.inventory = inventory
        self.debits = debits
        self.accounts = accounts
        self.cache = cache
        self.warning_for = warning_for
        self.clock = clock
        self._clock_cache: tuple[int, int, int, dict[str, Any]] | None = None

    def allocation_json(self, record: AllocationRecord) -> dict[str, Any]:
        return {
            "id": record.id, "user": record.user, "server": record.server, "node": record.node,
            "gpus": [{"index": g["index"], "uuid": g["uuid"], "model": g["model"],
                      "fraction": format_tokens(Decimal(g["milli"]) / 1000)} for g in record.gpus],
            "price_per_hour": format_tokens(record.price_per_hour), "borrowed": record.borrowed,
            "started_at": iso(record.created_at), "released_at": iso(record.released_at),
            "description": self.inventory.describe(record),
        }

    def me(self, user: str, groups: Iterable[str] = ()) -> dict[str, Any]:
        groups = frozenset(groups)
        today = self.clock().astimezone(self.settings.tz).date()
        cached = self.cache.entries.get(user)
        if cached is None or cached[0] != (groups, today):
            generation = self.cache.generation
            self.accounts.ensure(user, groups)
            view = self._account_view(user, groups)
            if generation == self.cache.generation:
                self.cache.entries[user] = ((groups, today), view)
        else:
            view = cached[1]
        warning = self.warning_for(user)
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
        if cached is not None and cached[:3] == (second, self.cache.generation, self.debits.changed):
            return cached[3]
        daily_at, monthly_at = next_credit_times(now, self.settings.tz)
        last = self.debits.last_debit()
        view = {
            "credits": {"next_daily_at": iso(daily_at), "next_monthly_at": iso(monthly_at)},
            "last_debit_at": iso(last[1]) if last else None,
            "accounting": self.debits.accounting_status(),
        }
        self._clock_cache = (second, self.cache.generation, self.debits.changed, view)
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
