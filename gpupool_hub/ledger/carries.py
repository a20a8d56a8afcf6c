"""The debit remainders carried to each user's next debit on a model (``gpupool_carries``),
so that debits rounded to the milli-token add up exactly: written in the debit's own
transaction (the book's ``post_many``), read by the debit job. Reached as ``ledger.carries``."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .database import Db, chunks
from .schema import carries


class Carries:
    """Sub-milli-token remainders per (account, model)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    @staticmethod
    def store(conn: Connection, carry: Mapping[tuple[str, str], Decimal]) -> None:
        """Replace the remainders of the (account, model) pairs in ``carry``, in the caller's
        transaction (a zero one is dropped)."""
        keys = list(carry)
        for chunk in chunks(keys):
            conn.execute(carries.delete().where(
                sa.tuple_(carries.c.account, carries.c.model).in_([tuple(k) for k in chunk])))
        rows = [dict(account=a, model=m, residual=str(v)) for (a, m), v in carry.items() if v]
        for chunk in chunks(rows):
            conn.execute(carries.insert(), list(chunk))

    def remainders(self) -> dict[tuple[str, str], Decimal]:
        """Every stored debit remainder (small: one row per user and model that had one)."""
        with self.db.read() as conn:
            return {(r.account, r.model): Decimal(r.residual) for r in conn.execute(sa.select(carries))}
