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

    ``free`` carries :meth:`Pool.free_summary` at the time of the refusal so the
    message shown to the user can say what *is* free.
    """

    def __init__(self, message: str, free: object = None) -> None:
        super().__init__(message)
        self.free = free


class ModelUnavailable(PlacementError):
    """No node offers an allowed GPU model, or no node could ever fit the request."""


class PlacementConflict(PlacementError):
    """A placement cannot be applied (restore after restart, duplicate id, unknown id)."""
