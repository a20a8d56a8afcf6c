"""Exceptions of the placement engine.

Every failure is an explicit exception so the spawner can tell a user *why*
nothing was placed: a malformed request, a pool that is full right now, or a
request no node in this pool could ever satisfy.
"""

from __future__ import annotations


class PlacementError(Exception):
    """Base class: anything the placement engine refuses to do."""


class InvalidRequest(PlacementError, ValueError):
    """The request itself is malformed (e.g. 1.5 GPUs); retrying cannot help."""


class InventoryError(ValueError):
    """The static node configuration is malformed; the message names the key."""


class NoCapacity(PlacementError):
    """The request would fit an empty pool, but not the pool as it is now.

    ``free`` is :meth:`Pool.free_summary` at the time of the refusal, so the
    message shown to the user can say what *is* free. It is computed on first
    access (a full pool refuses often, and a summary walks every GPU).
    """

    def __init__(self, message: str, free: object = None) -> None:
        super().__init__(message)
        self._free = free
        self._message = message

    @property
    def free(self) -> object:
        if callable(self._free):
            self._free = self._free()
        return self._free

    def __str__(self) -> str:
        free = self.free
        return f"{self._message}; free now: {free}" if free is not None else self._message


class ModelUnavailable(PlacementError):
    """No node offers an allowed GPU model, or no node could ever fit the request."""


class PlacementConflict(PlacementError):
    """A placement cannot be applied (restore after restart, duplicate id, unknown id)."""
