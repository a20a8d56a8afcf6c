"""Accounts: opening them, the credits they are due, and admins' grants.

Credits are posted lazily (at a user's first request of the day) and by the
replenish job for every hub user; both go through ``ensure`` so a credit is
never posted twice (each has its idempotency key).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..config import GPUPool
from ..credits import due_credits
from ..keys import entry_key
from ..ledger import Ledger, Posting, UnknownAccount

if TYPE_CHECKING:
    from .views import ViewCache


class Accounts:
    """Opens accounts and posts credits and grants; forgets cached views it changes."""

    def __init__(self, settings: GPUPool, ledger: Ledger, cache: "ViewCache", clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.ledger = ledger
        self.cache = cache
        self.clock = clock

    def ensure(self, user: str, groups: Iterable[str] = ()) -> bool:
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
        self.cache.forget(user)
        return True

    def replenish(self, users: Iterable[tuple[str, Iterable[str]]]) -> int:
        """Credits for every (user, groups) pair; returns how many users were looked at."""
        n = 0
        posted = False
        for user, groups in users:
            posted |= self.ensure(user, groups)
            n += 1
        if posted:
            self.cache.forget()
        return n

    def grant(self, user: str, amount: Decimal, reason: str, actor: str,
              idempotency_key: str | None) -> tuple[Any, bool]:
        """An admin's grant (or, negative, adjustment); the same key never posts twice."""
        kind = "grant" if amount > 0 else "adjustment"
        key = entry_key("api-grant", user, idempotency_key or uuid.uuid4().hex)
        posted = self.ledger.post(Posting(user, kind, amount, key, reason=reason, actor=actor))
        self.cache.forget(user)
        return posted.entry, posted.created
