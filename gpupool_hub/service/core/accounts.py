"""Accounts: opening them, the credits they are due, and admins' grants.

Credits are posted lazily (at a user's first request of the day) and by the
replenish job for every hub user; both go through ``ensure`` so a credit is
never posted twice (each has its idempotency key).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ...config import GPUPool
from ...money.credits import due_credits
from ...money.keys import entry_key
from ...ledger import Account, AuditEvent, Credited, Ledger, Posting, UnknownAccount
from ...reasons import AuditAction
from .threads import CoreThreads, reads, writes

if TYPE_CHECKING:
    from .views import ViewCache


def grant_text(amount: Decimal, user: str) -> str:
    """What a grant did, in words: "Granted 105 tokens to bob", "Took back 105 tokens from bob"."""
    size = f"{abs(amount).normalize():,f}"
    return f"Granted {size} tokens to {user}" if amount > 0 else f"Took back {size} tokens from {user}"


class Accounts:
    """Opens accounts and posts credits and grants; forgets cached views it changes."""

    def __init__(self, settings: GPUPool, ledger: Ledger, cache: "ViewCache", clock: Callable[[], datetime],
                 *, threads: CoreThreads | None = None) -> None:
        self.settings = settings
        self.ledger = ledger
        self.cache = cache
        self.clock = clock
        self.threads = threads

    def today(self) -> date:
        return self.clock().astimezone(self.settings.tz).date()

    def current(self, user: str) -> bool:
        """Whether ``ensure`` has nothing to post (the account exists and has today's
        credits): a read only, so a reader thread may answer it."""
        try:
            through = self.ledger.account(user).credits_through
        except UnknownAccount:
            return False
        return through is not None and through >= self.today()

    @reads
    def needing_credits(self, users: Iterable[tuple[str, Iterable[str]]]) -> list[tuple[str, list[str]]]:
        """The (user, groups) pairs whose accounts ``ensure`` would change: read only,
        so the replenish job keeps the writer thread for the few that need it."""
        pairs = [(u, list(g)) for u, g in users]
        through = self.ledger.credits_through_of(u for u, _ in pairs)
        today = self.today()
        return [(u, g) for u, g in pairs if through.get(u) is None or through[u] < today]  # type: ignore[operator]

    @writes
    def ensure(self, user: str, groups: Iterable[str] = ()) -> bool:
        """Open the account and post the credits due (the initial grant for a new user).

        Returns whether anything was posted."""
        return isinstance(self._credit(user, groups), Credited)

    @writes
    def balance_after_credits(self, user: str, groups: Iterable[str] = ()) -> Decimal:
        """The balance once the credits due are posted: every spawn asks, and the read that
        found nothing due, or the transaction that posted what was, knows it (no second read)."""
        return self._credit(user, groups).balance

    def _credit(self, user: str, groups: Iterable[str]) -> Account | Credited:
        """The account as read when no credit was due, else what posting the credits due
        (and opening the account) left."""
        now = self.clock()
        rules = self.settings.rules_for(set(groups))
        try:
            account = self.ledger.account(user)
        except UnknownAccount:
            account = None
        through = None if account is None else account.credits_through
        today = now.astimezone(self.settings.tz).date()
        if account is not None and through is not None and through >= today:
            return account
        due = due_credits(user, rules, through, now, self.settings.tz)
        credited = self.ledger.post_credits(user, due, through=today, max_balance=rules.max_balance, now=now)
        self.cache.forget(user)
        return credited

    @writes
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

    @writes
    def grant(self, user: str, amount: Decimal, reason: str, actor: str,
              idempotency_key: str | None) -> tuple[Any, bool]:
        """An admin's grant (or, negative, adjustment); the same key never posts twice. The
        audit log records it ("Took back 105 tokens from bob") in the same transaction."""
        kind = "grant" if amount > 0 else "adjustment"
        key = entry_key("api-grant", user, idempotency_key or uuid.uuid4().hex)
        event = AuditEvent(at=self.clock(), user=user, server="", action=AuditAction.GRANT.value,
                           reason=f"{grant_text(amount, user)} (by {actor}): {reason}",
                           detail={"amount": str(amount), "actor": actor})
        [posted] = self.ledger.post_many([Posting(user, kind, amount, key, reason=reason, actor=actor)],
                                         audit_event=event)
        self.cache.forget(user)
        return posted.entry, posted.created
