"""Spawn attempts: the spawner's idempotency key on ``POST /allocations`` and releases by key.

Why: a spawner that gives up on a request (its timeout, a cancelled spawn, a
failed start) cannot know whether the service placed it: a request queued in
a paused service is still processed when it resumes, and the GPUs were then
held and charged until the reconcile job noticed, minutes later. So every
spawn attempt carries a key. A ``POST`` repeated with the same key returns
the same allocation; the spawner, on giving up, releases *by key*; the
service releases what the key got as never charged (at its start) and keeps a
tombstone for the key for a while, so that a ``POST`` arriving after its
release is refused instead of placing GPUs nobody will use.

Tombstones live in memory: a ``POST`` cannot outlive the service process that
was to answer it (its connection goes with it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timezone

__all__ = ["KEY_MAX_LENGTH", "AttemptAbandoned", "Tombstones", "parse_instant"]

KEY_MAX_LENGTH = 200


class AttemptAbandoned(Exception):
    """A ``POST /allocations`` whose spawn attempt was already released by key (HTTP 410)."""


class Tombstones:
    """Keys of abandoned spawn attempts, each remembered for ``ttl`` seconds (at most ``size`` keys)."""

    def __init__(self, ttl: float = 3600.0, size: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._keys: OrderedDict[str, float] = OrderedDict()

    def add(self, key: str) -> None:
        self._expire()
        self._keys[key] = self.clock() + self.ttl
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        self._expire()
        return key in self._keys

    def __len__(self) -> int:
        self._expire()
        return len(self._keys)

    def _expire(self) -> None:
        now = self.clock()
        while self._keys and next(iter(self._keys.values())) <= now:
            self._keys.popitem(last=False)


def parse_instant(value: str) -> datetime:
    """An ISO 8601 instant with a zone (``2026-11-22T10:00:00Z``); ValueError otherwise."""
    when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone; send UTC with a Z")
    return when.astimezone(timezone.utc)
