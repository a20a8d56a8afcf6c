"""How the API writes instants, and how debit intervals are aligned: in one place
so that every answer, audit entry and idempotency key agrees to the second."""

from __future__ import annotations

from datetime import datetime, timezone


def iso(value: datetime | None) -> str | None:
    """UTC, whole seconds, ``Z``: the one timestamp format of the API."""
    if value is None:
        return None
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def align_down(t: datetime, seconds: int) -> datetime:
    """The start of the ``seconds``-long interval (aligned to the epoch) that holds ``t``."""
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, timezone.utc)
