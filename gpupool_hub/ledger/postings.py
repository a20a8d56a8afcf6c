"""Writing entries and the balances they change, in the caller's transaction: the one
write of money. Every entry has a unique idempotency key; a replayed key records
nothing and answers the first entry, the same key with other content is refused.

The book (:class:`~gpupool_hub.ledger.book.Ledger`) opens the transaction and calls
:func:`write_postings`; nothing else inserts entries or edits a balance.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..money.keys import stored_key
from ..money.units import from_milli, to_milli
from .database import LedgerError, aware, chunks, db_time
from .records import Entry, IdempotencyConflict, Posted, Posting
from .schema import accounts, entries

#: an entry's columns as :func:`write_postings` writes them (the id is the database's)
ENTRY_COLUMNS = tuple(entries.c[n] for n in (
    "account", "kind", "amount_milli", "idempotency_key", "key_text", "reason", "actor", "created_at",
    "interval_start", "interval_end", "model", "gpu_seconds"))
#: rows bound in one PostgreSQL statement (``_arrays``): a debit cycle of 10,000 servers is one
BULK_ROWS = 10_000

# Statements of every spawn, built once with bound parameters: building one (SQLAlchemy's
# coercion of each clause) cost about as much as running it, 0.15 ms a statement here.
_ADD_TO_BALANCE = (accounts.update().where(accounts.c.name == sa.bindparam("account"))
                   .values(balance_milli=accounts.c.balance_milli + sa.bindparam("delta")))

#: one entry row (named as ``ENTRY_COLUMNS``), its id back if its key is new
_ONE_ENTRY = sa.text(
    f"INSERT INTO {entries.name} ({', '.join(c.name for c in ENTRY_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c.name for c in ENTRY_COLUMNS)}) ON CONFLICT DO NOTHING RETURNING id, idempotency_key",
).bindparams(*(sa.bindparam(c.name, type_=c.type) for c in ENTRY_COLUMNS))


def entry_of(row: sa.Row) -> Entry:  # type: ignore[type-arg]
    """An ``entries`` row as the :class:`Entry` it records."""
    m = row._mapping
    return Entry(
        id=m["id"],
        account=m["account"],
        kind=m["kind"],
        amount=from_milli(m["amount_milli"]),
        key=m["key_text"] or m["idempotency_key"],
        reason=m["reason"],
        actor=m["actor"],
        created_at=aware(m["created_at"]),  # type: ignore[arg-type]
        interval_start=aware(m["interval_start"]),
        interval_end=aware(m["interval_end"]),
        model=m["model"],
        gpu_seconds=None if m["gpu_seconds"] is None else Decimal(m["gpu_seconds"]),
    )


def _same(entry: Entry, posting: Posting) -> bool:
    return (entry.account, entry.kind, entry.amount) == (posting.account, posting.kind, posting.amount)


def ensure_accounts(conn: Connection, names: Iterable[str], now: datetime) -> None:
    """Open an empty account for each of ``names`` that has none."""
    # the names as one bound array, the time bound once: a debit cycle names 10,000
    # accounts that all exist, and a row each with its own time was a fifth of its write
    wanted = sorted(set(names))
    if not wanted:
        return
    if conn.dialect.name == "sqlite":
        rows, named = "SELECT value, 0, :t, NULL FROM json_each(:names) WHERE true", json.dumps(wanted)
    else:
        rows, named = "SELECT unnest(CAST(:names AS text[])), 0, :t, NULL", wanted
    stmt = sa.text(f"INSERT INTO {accounts.name} (name, balance_milli, created_at, credits_through) {rows} "
                   "ON CONFLICT DO NOTHING").bindparams(sa.bindparam("t", type_=sa.DateTime))
    conn.execute(stmt, {"names": named, "t": db_time(now)})


def write_postings(conn: Connection, postings: Sequence[Posting], now: datetime, ensured: bool = False) -> list[Posted]:
    """Record ``postings`` in the transaction of ``conn`` and add them to their balances.

    ``ensured``: the caller opened the postings' accounts in this transaction already."""
    if not postings:
        return []
    keys = [p.key for p in postings]
    if len(set(keys)) != len(keys):
        raise IdempotencyConflict("the same idempotency key appears twice in one batch")
    if not ensured:
        ensure_accounts(conn, (p.account for p in postings), now)
    created_at = db_time(now)
    # the debits of one interval share its start and end: each distinct time is converted once
    naive: dict[datetime | None, datetime | None] = {None: None}
    for p in postings:
        for t in (p.interval_start, p.interval_end):
            if t not in naive:
                naive[t] = db_time(t)
    stored = {p.key: stored_key(p.key) for p in postings}
    milli = [to_milli(p.amount) for p in postings]
    rows = [
        (p.account, p.kind, m, stored[p.key], None if stored[p.key] == p.key else p.key, p.reason, p.actor,
         created_at, naive[p.interval_start], naive[p.interval_end], p.model, p.gpu_seconds)
        for p, m in zip(postings, milli)
    ]
    new_ids = _insert_entries(conn, rows)
    inserted: dict[str, Entry] = {}
    deltas: dict[str, int] = defaultdict(int)
    aware_times = {t: aware(v) for t, v in naive.items()}
    created = aware(created_at)
    for p, m in zip(postings, milli):
        if stored[p.key] in new_ids:
            inserted[p.key] = Entry(
                id=new_ids[stored[p.key]], account=p.account, kind=p.kind, amount=from_milli(m), key=p.key,
                reason=p.reason, actor=p.actor, created_at=created,  # type: ignore[arg-type]
                interval_start=aware_times[p.interval_start], interval_end=aware_times[p.interval_end],
                model=p.model, gpu_seconds=p.gpu_seconds)  # what was written: no second read
            deltas[p.account] += m
    changes = [(n, d) for n, d in deltas.items() if d]
    if changes:
        _add_to_balances(conn, changes)
    replayed = [p for p in postings if p.key not in inserted]
    existing: dict[str, Entry] = {}
    for chunk in chunks([stored[p.key] for p in replayed]):
        for row in conn.execute(sa.select(entries).where(entries.c.idempotency_key.in_(chunk))):
            entry = entry_of(row)
            existing[entry.key] = entry
    results = []
    for p in postings:
        if p.key in inserted:
            results.append(Posted(inserted[p.key], True))
            continue
        first = existing.get(p.key)
        if first is None:  # pragma: no cover - the unique index makes this impossible
            raise LedgerError(f"entry {p.key!r} neither inserted nor found")
        if not _same(first, p):
            raise IdempotencyConflict(
                f"idempotency key {p.key!r} was already used for a {first.kind} of {first.amount} "
                f"to {first.account!r}; refusing a {p.kind} of {p.amount} to {p.account!r}"
            )
        results.append(Posted(first, False))
    return results


def _insert_entries(conn: Connection, rows: Sequence[Sequence[Any]]) -> dict[str, int]:
    """Insert entry rows (values in ``ENTRY_COLUMNS`` order) whose keys are new: {stored key: id}.

    Not SQLAlchemy's ``executemany``: for a debit cycle's 10,000 rows its per-row parameter
    work was most of the write, and psycopg parses each of its 500-row ``VALUES`` batches anew.
    SQLite gets the driver's own ``executemany``; PostgreSQL one statement over typed arrays.
    """
    names = ", ".join(c.name for c in ENTRY_COLUMNS)
    if len(rows) == 1:  # a grant or a credit: one plain statement, one round trip
        got = conn.execute(_ONE_ENTRY, dict(zip((c.name for c in ENTRY_COLUMNS), rows[0]))).first()
        return {} if got is None else {got[1]: got[0]}
    if conn.dialect.name == "sqlite":
        # the accounts were ensured first, so this transaction holds SQLite's one write lock:
        # the rows past the largest id before the insert are this batch's
        last = conn.execute(sa.select(sa.func.max(entries.c.id))).scalar() or 0
        marks = ", ".join("?" * len(ENTRY_COLUMNS))
        conn.exec_driver_sql(f"INSERT INTO {entries.name} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING",
                             _bound(conn, ENTRY_COLUMNS, rows))
        new = conn.execute(sa.select(entries.c.id, entries.c.idempotency_key).where(entries.c.id > last))
        return {key: new_id for new_id, key in new}
    new_ids: dict[str, int] = {}
    for chunk in chunks(rows, BULK_ROWS):
        arrays, params = _arrays(conn, ENTRY_COLUMNS, chunk)
        stmt = sa.text(f"INSERT INTO {entries.name} ({names}) SELECT * FROM unnest({arrays}) "
                       "ON CONFLICT DO NOTHING RETURNING id, idempotency_key")
        for new_id, key in conn.execute(stmt, params):
            new_ids[key] = new_id
    return new_ids


def _add_to_balances(conn: Connection, changes: Sequence[tuple[str, int]]) -> None:
    """``balance_milli += delta`` for each (account, delta), as ``_insert_entries`` writes rows."""
    table = accounts.name
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"UPDATE {table} SET balance_milli = balance_milli + ? WHERE name = ?",
                             [(d, n) for n, d in changes])
        return
    if len(changes) == 1:
        conn.execute(_ADD_TO_BALANCE, {"account": changes[0][0], "delta": changes[0][1]})
        return
    for chunk in chunks(changes, BULK_ROWS):
        arrays, params = _arrays(conn, (accounts.c.name, accounts.c.balance_milli), chunk)
        conn.execute(sa.text(f"UPDATE {table} SET balance_milli = {table}.balance_milli + d.delta "
                             f"FROM unnest({arrays}) AS d(name, delta) WHERE {table}.name = d.name"), params)


def _bound(conn: Connection, columns: Sequence[sa.Column], rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows as the driver takes them: each value converted as its column's type binds it
    (SQLite's times become text), each distinct value once (a batch shares a few times)."""
    dialect = conn.dialect
    values = [list(column) for column in zip(*rows)]
    for i, column in enumerate(columns):
        convert = column.type.dialect_impl(dialect).bind_processor(dialect)
        if convert is not None:
            done: dict[Any, Any] = {v: None if v is None else convert(v) for v in set(values[i])}
            values[i] = [done[v] for v in values[i]]
    return list(zip(*values))


def _arrays(conn: Connection, columns: Sequence[sa.Column], rows: Sequence[Sequence[Any]]) -> tuple[str, dict[str, Any]]:
    """PostgreSQL: one bound array a column, cast to the column's type, for ``unnest``."""
    casts = ", ".join(f"CAST(:c{i} AS {c.type.compile(dialect=conn.dialect)}[])" for i, c in enumerate(columns))
    return casts, {f"c{i}": [row[i] for row in rows] for i in range(len(columns))}
