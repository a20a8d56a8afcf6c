"""The ledger: the only package that touches the database.

Amounts are integer milli-tokens in the database and ``Decimal`` outside it. SQLite (the
default) and PostgreSQL are both first-class; concurrent writers from several processes
are safe on both: SQLite transactions take the write lock up front (``BEGIN IMMEDIATE``),
PostgreSQL relies on the unique key and row locks.

- ``schema.py``: the metadata and every table; ``migrations/``: the schema's Alembic revisions
  (``upgrade_database``: ``gpupool-service upgrade-db``), and the hand-written steps before them.
- ``engine.py``: :class:`Db` (the engine, reader connections, checkpoints) and the errors
  of a busy or unreachable database.
- ``records.py``: the values the ledger takes and answers.
- ``book.py``: :class:`Ledger`, accounts, entries and balances (``postings.py`` writes
  them); it builds the stores on its one ``Db``, reached as attributes:
  ``ledger.allocations``, ``ledger.queue``, ``ledger.audit``, ``ledger.nodes``,
  ``ledger.intervals``, ``ledger.gpu_use``, ``ledger.carries``, ``ledger.leases`` and the
  pages' ``ledger.reports``. A store imports no other store and not the book.

Tables are imported from ``gpupool_hub.ledger.schema``.
"""

from __future__ import annotations

from .book import Ledger
from .database import (DEFAULT_BUSY_TIMEOUT, UNAVAILABLE_MESSAGE, Db, LedgerBusy, LedgerError, is_database_busy,
    is_database_unavailable, make_engine, normalize_url, utcnow, write_deadline)
from .migrations import SCHEMA_VERSION, SchemaOutdated, backup_sqlite, upgrade_database
from .records import (KINDS, Account, AccountRow, AllocationRecord, AuditEvent, Credited, DayTotal, Entry, GpuUse,
                      IdempotencyConflict, Mismatch, Posted, Posting, UnknownAccount, VerifyReport, Window)
from .reports import SORTS

__all__ = [
    "DEFAULT_BUSY_TIMEOUT", "KINDS", "SCHEMA_VERSION", "SORTS", "UNAVAILABLE_MESSAGE",
    "Account", "AccountRow", "AllocationRecord", "AuditEvent", "Credited", "DayTotal", "Db", "Entry", "GpuUse",
    "IdempotencyConflict", "Ledger", "LedgerBusy", "LedgerError", "Mismatch", "Posted", "Posting", "SchemaOutdated",
    "UnknownAccount", "VerifyReport", "Window",
    "backup_sqlite", "is_database_busy", "is_database_unavailable", "make_engine", "normalize_url",
    "upgrade_database", "utcnow", "write_deadline",
]
