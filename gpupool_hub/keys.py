"""Idempotency keys for ledger entries.

A key names the fact an entry records ("alice's daily credit for 2026-11-21"),
so a job that runs twice produces the same key and the ledger records one
entry. Free-text parts (usernames, model names) are percent-encoded so that
``:`` inside a username can never make two different facts share a key.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from urllib.parse import quote


def _part(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, date):
        return value.isoformat()
    return quote(str(value), safe="")


def entry_key(kind: str, *parts: object) -> str:
    return ":".join([kind, *(_part(p) for p in parts)])
