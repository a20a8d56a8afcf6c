"""Who waits for GPUs of given models: the pressure that lets the cull and idle jobs take GPUs back
from a holder (:func:`demand`). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ..placement.request import normalize_model


def demand(waiting: Iterable[tuple[datetime, str, frozenset[str] | None]],
           asks: Iterable[tuple[str, frozenset[str]]]) -> dict[tuple[str, frozenset[str]], datetime | None]:
    """For each (user, models held) in ``asks``: the newest retry of another user's waiting
    entry that GPUs of those models (pool model strings) would serve, or None. That is the
    pressure to cull or reclaim from the holder; a user's own entry never counts.

    ``waiting``: (last retry, user, models wanted: normalised keys, None for any) of each
    waiting entry. One pass over them for all asks, keeping per model the newest retry of
    the two users who retried last: whoever asks, another user's newest is among them."""
    newest: dict[str | None, list[tuple[datetime, str]]] = {}
    for at, user, models in waiting:
        for key in models if models is not None else (None,):
            kept = newest.setdefault(key, [])
            for i, (seen, who) in enumerate(kept):
                if who == user:
                    kept[i] = max(kept[i], (at, user))
                    break
            else:
                kept.append((at, user))
            kept.sort(reverse=True)
            del kept[2:]
    out = {}
    for user, models in asks:
        keys = [normalize_model(m) for m in models]
        out[(user, models)] = max((at for key in (*keys, None) for at, who in newest.get(key, ()) if who != user),
                                  default=None)
    return out
