"""The ledger's database: one :class:`Db` holds the engine writes go through, the
connections reads use, the background checkpoint, and the errors a busy or unreachable
database raises. Every store of the ledger is built on the same ``Db``.

Reads never wait for writers: on SQLite they use connections of their own (WAL mode,
plain deferred ``BEGIN``, ``query_only``), so another process holding the write lock
delays no read. A write waits for the database at most ``busy_timeout`` seconds (or
until the deadline of :func:`write_deadline`), then raises :class:`LedgerBusy`; the API
answers that with 503 and ``Retry-After``.

A write that crosses SQLite's checkpoint threshold (1,000 pages of WAL) copies them into
the database file before it returns: on a ledger of millions of entries that stalls the
writer for up to a second, every few dozen spawns. The service therefore opens the
ledger with ``background_checkpoints``: its writes only checkpoint past a 10,000-page
backstop, and a job checkpoints every few seconds from a reader connection
(:meth:`Db.checkpoint`), which never blocks a write.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool


class LedgerError(RuntimeError):
    """The ledger cannot be used (schema too new, database unreachable)."""


class LedgerBusy(LedgerError):
    """A write could not get the database within its time bound (another writer holds
    the lock). Nothing was written by the transaction that raised it; retry later.

    ``retry_after`` is a suggestion in whole seconds for the ``Retry-After`` header."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)


#: PostgreSQL states that mean "busy, try again": lock_not_available, query_canceled
#: (lock_timeout/statement_timeout), deadlock_detected, serialization_failure
_BUSY_SQLSTATES = frozenset({"55P03", "57014", "40P01", "40001"})


def is_database_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says the database was busy (as opposed to broken or a bug).

    The service answers these with 503 and Retry-After: SQLite's "database is
    locked"/"database is busy" past ``busy_timeout``, PostgreSQL's lock and
    statement timeouts, an exhausted connection pool, or :class:`LedgerBusy`.
    """
    if isinstance(exc, (LedgerBusy, sa.exc.TimeoutError)):
        return True
    if isinstance(exc, sa.exc.OperationalError):
        orig = exc.orig
        if getattr(orig, "sqlstate", None) in _BUSY_SQLSTATES:
            return True
        text = str(orig).lower()
        return "database is locked" in text or "database is busy" in text or "database table is locked" in text
    return False


#: PostgreSQL states that mean "the server is not there": admin_shutdown, crash_shutdown,
#: cannot_connect_now (starting up or shutting down), too_many_connections; and class 08,
#: connection_exception
_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})

UNAVAILABLE_MESSAGE = "the ledger database cannot be reached; nothing was changed, try again in a few seconds"


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database server is down or unreachable (not a bug, not
    the caller's fault): the service answers these with 503 and Retry-After, like a
    busy database. A refused or dropped PostgreSQL connection, a server shutting down,
    a SQLite file that cannot be opened."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, sa.exc.OperationalError) or is_database_busy(exc):
        return False
    orig = exc.orig
    state = getattr(orig, "sqlstate", None) or ""
    if state.startswith("08") or state in _UNAVAILABLE_SQLSTATES:
        return True
    if not state and type(orig).__module__.startswith("psycopg"):
        return True  # failed before the server said anything: refused, unknown host, timed out
    return "unable to open database file" in str(orig).lower()


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def db_time(value: datetime | None) -> datetime | None:
    """Store naive UTC: the same value on every backend."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError(f"timestamps must be timezone-aware, got {value!r}")
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def aware(value: datetime | None) -> datetime | None:
    """A stored (naive UTC) time as an aware one."""
    return None if value is None else value.replace(tzinfo=timezone.utc)


def normalize_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here (the driver we ship), not psycopg2."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


#: Default seconds a write waits for the database lock before raising LedgerBusy.
DEFAULT_BUSY_TIMEOUT = 5.0
#: WAL pages after which a write checkpoints itself, when checkpoints run in the background
BACKSTOP_CHECKPOINT_PAGES = 10_000

BUSY_MESSAGE = ("the ledger database is busy: another writer holds its lock; nothing was changed, "
                "try again in a few seconds")

_deadline = threading.local()


@contextmanager
def write_deadline(deadline: float | None) -> Iterator[None]:
    """Writes in this thread give up at ``deadline`` (``time.monotonic()``), not after
    a full busy timeout each: a request queued behind others keeps one overall bound."""
    previous = getattr(_deadline, "value", None)
    _deadline.value = deadline
    try:
        yield
    finally:
        _deadline.value = previous


def _wait_ms(busy_timeout: float) -> int:
    """How long the next transaction of this thread may wait for the lock, in ms."""
    deadline = getattr(_deadline, "value", None)
    if deadline is None:
        return int(busy_timeout * 1000)
    left = deadline - time.monotonic()
    if left <= 0:
        raise LedgerBusy(BUSY_MESSAGE, math.ceil(busy_timeout))
    return max(1, int(left * 1000))


def _is_memory(url: sa.engine.URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def make_engine(url: str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT, reader: bool = False,
                autocheckpoint: int | None = None, **kwargs: object) -> Engine:
    """An engine for writes (``reader=False``) or for reads only.

    An in-memory SQLite database is one shared connection (``StaticPool``): every
    thread must see the same database, and the service core runs in threads.
    ``autocheckpoint``: SQLite's ``wal_autocheckpoint`` for these connections (None:
    SQLite's own 1,000 pages)."""
    url = normalize_url(url)
    parsed = sa.engine.make_url(url)
    if _is_memory(parsed):
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}, **kwargs}
    elif parsed.get_backend_name() == "postgresql":
        # a write waits for row locks at most busy_timeout, then fails with 55P03 (LedgerBusy)
        options = f"-c lock_timeout={int(busy_timeout * 1000)}"
        kwargs = {"connect_args": {"options": options}, **kwargs}
    engine = sa.create_engine(url, **kwargs)  # type: ignore[arg-type]
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine, busy_timeout, reader, autocheckpoint)
    return engine


def _configure_sqlite(engine: Engine, busy_timeout: float, reader: bool, autocheckpoint: int | None) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not the driver, open transactions, so BEGIN IMMEDIATE below is ours.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
            if autocheckpoint is not None:
                cur.execute(f"PRAGMA wal_autocheckpoint={int(autocheckpoint)}")
        if reader:
            cur.execute("PRAGMA query_only=ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        if reader:
            # A deferred transaction: one consistent snapshot, and in WAL mode it
            # never waits for a writer (only BEGIN IMMEDIATE takes the write lock).
            conn.exec_driver_sql("BEGIN")
            return
        # Take the write lock at the start: two processes posting at once then
        # queue instead of failing half-way with "database is locked"; wait for
        # it no longer than this thread's deadline allows.
        conn.exec_driver_sql(f"PRAGMA busy_timeout={_wait_ms(busy_timeout)}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def insert_new(conn: Connection, table: sa.Table):  # type: ignore[no-untyped-def]
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect (built once per dialect:
    statements are immutable, ``.values()`` and ``.returning()`` answer copies)."""
    key = (conn.dialect.name, table.name)
    built = _INSERTS.get(key)
    if built is None:
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif conn.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:  # pragma: no cover - documented as unsupported
            raise LedgerError(f"unsupported database {conn.dialect.name!r}; use SQLite or PostgreSQL")
        built = _INSERTS[key] = insert(table).on_conflict_do_nothing()
    return built


_INSERTS: dict[tuple[str, str], Any] = {}


def chunks(items: Sequence, size: int = 500) -> Iterator[Sequence]:  # type: ignore[type-arg]
    """``items`` in slices of ``size``: one ``IN (...)`` or ``executemany`` each."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Db:
    """The engine writes go through, the connections reads use, over any SQLAlchemy URL
    (SQLite or PostgreSQL). ``background_checkpoints``: the caller runs :meth:`checkpoint`
    every few seconds, so writes need not (see the module docstring); for a long-lived
    process only."""

    def __init__(self, url: str, *, engine: Engine | None = None, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 background_checkpoints: bool = False) -> None:
        self.busy_timeout = busy_timeout
        self.engine = engine or make_engine(
            url, busy_timeout=busy_timeout,
            autocheckpoint=BACKSTOP_CHECKPOINT_PAGES if background_checkpoints else None)
        # SQLite files get reader connections of their own (see the module docstring);
        # an in-memory database is one connection, and PostgreSQL readers never wait anyway.
        self.concurrent_reads = self.engine.dialect.name != "sqlite" or not _is_memory(self.engine.url)
        self._own_reader = self.engine.dialect.name == "sqlite" and self.concurrent_reads
        self.reader: Engine
        if self._own_reader:
            self.reader = make_engine(self.engine.url.render_as_string(hide_password=False),
                                      busy_timeout=busy_timeout, reader=True)
        elif self.engine.dialect.name == "postgresql":
            # The writer's pool, without a transaction: at READ COMMITTED each statement sees
            # its own snapshot in a transaction too, and BEGIN and ROLLBACK were two more
            # round trips for every read (a spawn reads twice, every GET me once).
            self.reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        else:
            self.reader = self.engine

    def close(self) -> None:
        self.engine.dispose()
        if self._own_reader:
            self.reader.dispose()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction; ``LedgerBusy`` when the database stays locked too long."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except sa.exc.OperationalError as e:
            if not is_database_busy(e):
                raise
            raise LedgerBusy(BUSY_MESSAGE, math.ceil(self.busy_timeout)) from e

    def read(self) -> Connection:
        """A connection for reads only: never waits for a writer."""
        return self.reader.connect()

    def checkpoint(self) -> int:
        """Copy the SQLite write-ahead log into the database file as far as no reader still
        needs it (``PASSIVE``: it never waits for, nor blocks, a writer). The WAL pages left
        behind; 0 on PostgreSQL and in-memory databases, which have none."""
        if not self._own_reader:
            return 0
        with self.reader.connect() as conn:
            busy, logged, copied = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
        return max(0, logged - copied) if logged >= 0 else 0
