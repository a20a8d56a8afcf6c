"""The wait queue's entries: one waiting server each, by (user, server).

The value types that the queue and its collaborators (its order, estimates and
reports) share, apart so that none of them imports the queue
(:class:`~gpupool_hub.service.core.queue.WaitQueue`), which holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...placement.state import Placement
from ...queue.order import Waiter


@dataclass
class WaitingServer:
    """One waiting server; ``placement`` is set once dispatch reserved its GPUs."""

    waiter: Waiter
    requested_models: list[str] | None
    last_seen: datetime
    placement: Placement | None = None
    expired: bool = False  # waited past max_wait: the next retry gets the final refusal

    @property
    def key(self) -> tuple[str, str]:
        return self.waiter.user, self.waiter.server


class Entries(dict[tuple[str, str], WaitingServer]):
    """The entries by (user, server), with how many each user has: ``GET me`` asks for every
    request whether the user waits, and must not scan thousands of entries to learn it no.
    Only the queue's writer thread changes it; readers see a count at most one change old."""

    def __init__(self) -> None:
        super().__init__()
        self.per_user: dict[str, int] = {}
        self.version = 0  # counts changes, after each is made: a cached order is of one version

    def __setitem__(self, key: tuple[str, str], entry: WaitingServer) -> None:
        if key not in self:
            self.per_user[key[0]] = self.per_user.get(key[0], 0) + 1
        super().__setitem__(key, entry)
        self.version += 1

    def pop(self, key: tuple[str, str], *default: Any) -> Any:  # type: ignore[override]
        if key in self:
            left = self.per_user[key[0]] - 1
            if left:
                self.per_user[key[0]] = left
            else:
                del self.per_user[key[0]]
        try:
            return super().pop(key, *default)
        finally:
            self.version += 1

    def __delitem__(self, key: tuple[str, str]) -> None:
        self.pop(key)

    def clear(self) -> None:
        self.per_user.clear()
        super().clear()
        self.version += 1

    def has_user(self, user: str) -> bool:
        return user in self.per_user
