"""Users' hub groups, cached for a minute: credit rules and teams depend on them,
and asking the hub on every ``GET me`` would make the hub the bottleneck."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from .hubapi import HubClient, HubError

log = logging.getLogger("gpupool.groups")


class GroupCache:
    def __init__(self, hub: HubClient, max_age: float = 60) -> None:
        self.hub = hub
        self.max_age = max_age
        self._groups: dict[str, tuple[float, list[str]]] = {}

    def remember(self, user: str, groups: Iterable[str]) -> None:
        self._groups[user] = (time.monotonic(), list(groups))

    async def __call__(self, user: str) -> list[str]:
        cached = self._groups.get(user)
        if cached and time.monotonic() - cached[0] < self.max_age:
            return cached[1]
        try:
            model = await self.hub.user(user)
        except HubError as e:
            log.warning("Cannot read groups of %s: %s", user, e)
            return cached[1] if cached else []
        groups = list((model or {}).get("groups", []))
        self.remember(user, groups)
        return groups
