"""Leases in the meta table: which of several services on one ledger runs the periodic jobs
(``service/core/jobs_lease.py``). Reached as ``ledger.leases``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import sqlalchemy as sa

from .database import Db, insert_new, utcnow
from .schema import meta_table


class Leases:
    """Named leases, each held by one holder until it expires or is given up."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def claim(self, name: str, holder: str, ttl: float, *, now: datetime | None = None,
              holder_gone: Callable[[str], bool] = lambda _h: False) -> str:
        """Take or renew the lease ``name`` for ``holder``; the holder it has afterwards.

        Kept in the meta table as ``holder|expiry`` (one row, one transaction), so two
        services on one ledger agree on who runs the periodic jobs without a schema
        change. A lease is free once it expired, or when ``holder_gone`` says its holder
        no longer exists (a process of this host that was killed)."""
        now = now or utcnow()
        key = f"lease:{name}"[:64]
        with self.db.write() as conn:
            q = sa.select(meta_table.c.value).where(meta_table.c.key == key)
            if conn.dialect.name == "postgresql":
                q = q.with_for_update()
            row = conn.execute(q).first()
            if row is not None:
                current, _, until = row[0].rpartition("|")
                expired = datetime.fromisoformat(until) <= now if until else True
                if current != holder and not expired and not holder_gone(current):
                    return current
            value = f"{holder}|{(now + timedelta(seconds=ttl)).isoformat()}"[:255]
            if row is None:
                conn.execute(insert_new(conn, meta_table).values(key=key, value=value))
                won = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == key)).scalar_one()
                return won.rpartition("|")[0]
            conn.execute(meta_table.update().where(meta_table.c.key == key).values(value=value))
            return holder

    def release(self, name: str, holder: str) -> None:
        """Give the lease up at a clean stop, so a successor need not wait for it to expire."""
        key = f"lease:{name}"[:64]
        with self.db.write() as conn:
            value = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == key)).scalar()
            if value is not None and value.rpartition("|")[0] == holder:
                conn.execute(meta_table.delete().where(meta_table.c.key == key))
