"""Trait values a spawn sets on top of the admin's configuration, undone before the next spawn.

A spawner object lives across restarts of its server: a server started with
one profile (limits, ``spawner_override``) or one allocation (KubeSpawner's
node affinity, GPU limits) and restarted with another must start from the
admin's values again, not from what the last spawn left behind. Each layer of
overrides records the value it replaced the first time it sets a trait and
puts it back on :meth:`TraitOverrides.restore`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from traitlets import HasTraits

__all__ = ["TraitOverrides"]


class TraitOverrides:
    """One layer of trait overrides on ``owner``; restore layers in the reverse order of setting them."""

    def __init__(self, owner: HasTraits) -> None:
        self.owner = owner
        self._saved: dict[str, Any] = {}

    def missing(self, names: Mapping[str, Any] | list[str]) -> list[str]:
        """The names ``owner`` has no trait for (a profile overriding a trait of another spawner class)."""
        return [name for name in names if not self.owner.has_trait(name)]

    def set(self, values: Mapping[str, Any]) -> None:
        """Set each trait, remembering the value it had before this layer touched it."""
        for name, value in values.items():
            if name not in self._saved:
                self._saved[name] = getattr(self.owner, name)
            setattr(self.owner, name, value)

    def base(self, name: str) -> Any:
        """The value ``name`` had before this layer: a deep copy, safe to modify and set."""
        return copy.deepcopy(self._saved[name] if name in self._saved else getattr(self.owner, name))

    def restore(self) -> None:
        """Put back every value this layer replaced."""
        saved, self._saved = self._saved, {}
        for name, value in saved.items():
            setattr(self.owner, name, value)
