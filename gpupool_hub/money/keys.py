"""Idempotency keys for ledger entries.

A key names the fact an entry records ("alice's daily credit for 2026-11-21"),
so a job that runs twice produces the same key and the ledger records one
entry. Free-text parts (usernames, model names) are percent-encoded so that
``:`` inside a username can never make two different facts share a key.
"""

from __future__ import annotations

import hashlib
import re
from datetime import date, datetime, timezone
from functools import lru_cache
from urllib.parse import quote

#: what ``quote(..., safe="")`` leaves as it is
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def _part(value: object) -> str:
    if isinstance(value, datetime):
        return _utc_stamp(value)
    if isinstance(value, date):
        return value.isoformat()
    text = str(value)
    # a debit cycle keys 10,000 users' debits: most names need no quoting, models repeat
    return text if _UNRESERVED.fullmatch(text) else _quoted(text)


@lru_cache(maxsize=4096)
def _quoted(text: str) -> str:
    return quote(text, safe="")


@lru_cache(maxsize=256)
def _utc_stamp(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry_key(kind: str, *parts: object) -> str:
    return ":".join([kind, *(_part(p) for p in parts)])


#: the most bytes of a key the ledger stores as it is (its column holds 1024 characters)
MAX_KEY_BYTES = 1024
_HASHED = "sha256:"


def stored_key(key: str) -> str:
    """The key as the ledger's unique column holds it: the key itself, or for a key
    longer than ``MAX_KEY_BYTES`` its SHA-256 (the full key is kept beside it).

    Percent-encoding makes a part up to nine bytes a character ("é" is ``%C3%A9``),
    so a 180-character username or a 200-character Idempotency-Key overflowed the
    column on PostgreSQL; the hash keeps one fact one key at any length."""
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_KEY_BYTES and not key.startswith(_HASHED):
        return key
    return _HASHED + hashlib.sha256(raw).hexdigest()
