"""Debit and replenish: the two jobs that only write money to the ledger."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..accounts import Accounts
from ..debits import Debits
from ..groups import GroupCache
from ..hubapi import HubClient

InThread = Callable[..., Awaitable[Any]]


class DebitJob:
    """Charge every closed interval not yet charged (in the worker thread)."""

    def __init__(self, debits: Debits, in_thread: InThread) -> None:
        self.debits = debits
        self.in_thread = in_thread

    async def __call__(self) -> None:
        await self.in_thread(self.debits.debit_due)


class ReplenishJob:
    """Post the credits due to every hub user, including those who never logged in."""

    def __init__(self, hub: HubClient, groups: GroupCache, accounts: Accounts, in_thread: InThread) -> None:
        self.hub = hub
        self.groups = groups
        self.accounts = accounts
        self.in_thread = in_thread

    async def __call__(self) -> None:
        pairs = [(u["name"], u.get("groups", [])) async for u in self.hub.users()]
        for name, groups in pairs:
            self.groups.remember(name, groups)
        await self.in_thread(self.accounts.replenish, pairs)
