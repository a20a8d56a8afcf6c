"""Debit and replenish: the two jobs that only write money to the ledger."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..core.accounts import Accounts
from ..core.debits import Debits
from ..common.hubapi import GroupCache, HubClient

InThread = Callable[..., Awaitable[Any]]


class DebitJob:
    """Charge every closed interval not yet charged: usage is fetched in the job thread,
    each interval posted on the writer thread (``Debits.post``)."""

    def __init__(self, debits: Debits, in_thread: InThread) -> None:
        self.debits = debits
        self.in_thread = in_thread

    async def __call__(self) -> None:
        await self.in_thread(self.debits.debit_due)


class ReplenishJob:
    """Post the credits due to every hub user, including those who never logged in.

    Which accounts need credits is read on a reader thread; only those are
    written, a batch at a time, so allocations queued on the writer thread wait
    for one batch at most."""

    BATCH = 100

    def __init__(self, hub: HubClient, groups: GroupCache, accounts: Accounts) -> None:
        self.hub = hub
        self.groups = groups
        self.accounts = accounts

    async def __call__(self) -> None:
        pairs = [(u["name"], u.get("groups", [])) async for u in self.hub.users()]
        for name, groups in pairs:
            self.groups.remember(name, groups)
        due = await self.accounts.needing_credits.off_loop(pairs)
        for i in range(0, len(due), self.BATCH):
            await self.accounts.replenish.off_loop(due[i:i + self.BATCH])
