"""The ledger's schema versions: Alembic revisions in ``versions/``, one per schema change.

The baseline revision is schema version 9, the last of the hand-written versions that
``gpupool_meta`` counted; ``legacy.py`` brings a database of versions 1 to 8 to it.

Opening the ledger never changes an existing schema (:func:`open_schema`, called by every
``Ledger``), as JupyterHub's ``check_db_revision`` does: an empty database is created at the
head revision; a database at head is used as it is; an older one is refused with
:class:`SchemaOutdated`, naming ``gpupool-service upgrade-db`` and
``c.GPUPoolService.upgrade_db``, unless the caller asked to upgrade (then an SQLite file is
backed up first); a newer one (a revision this code does not know) is refused. The upgrade
(:func:`migrate`; ``gpupool-service upgrade-db`` is :func:`upgrade_database`):

- an empty database: ``upgrade head``;
- versions 1 to 8: the hand-written steps to 9, then as 9;
- version 9 (no Alembic revision stored): stamped at the baseline, then ``upgrade head``;
- a database under Alembic: ``upgrade head`` (nothing when it is there already).

All of it is one transaction, and one at a time: on PostgreSQL the transaction first takes an
advisory lock (:data:`UPGRADE_LOCK`), so a second process opening or upgrading the same
database waits for the first to commit (up to :data:`LOCK_WAIT_S`, then says that another
upgrade is running) and then finds the schema at head; two upgrades that overlapped used to
crash one of them with a raw IntegrityError. On SQLite the writer's ``BEGIN IMMEDIATE`` does
the same. The revision is stored in ``gpupool_alembic_version`` (not ``alembic_version``,
which is JupyterHub's own where the two share a database), and ``gpupool_meta``'s
``schema_version`` then reads ``SCHEMA_VERSION`` (10) for good: the releases before Alembic
know 9 and refuse such a database instead of writing to a schema they do not know.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from contextlib import closing
from datetime import datetime
from functools import cache
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection, Engine

from ..database import LedgerError, make_engine, normalize_url
from .legacy import LEGACY_VERSION, upgrade_to_9

log = logging.getLogger(__name__)

#: this package: env.py, script.py.mako and versions/
SCRIPT_LOCATION = str(Path(__file__).resolve().parent)
#: where Alembic keeps the database's revision
VERSION_TABLE = "gpupool_alembic_version"
#: the revision that stands for schema version 9
BASELINE = "3df454af529a"
#: ``gpupool_meta``'s schema_version on every database under Alembic (the revision says the rest)
SCHEMA_VERSION = LEGACY_VERSION + 1

#: the PostgreSQL advisory lock every schema check and upgrade holds for its transaction ("gpupool" in ASCII)
UPGRADE_LOCK = 0x677075706F6F6C
#: seconds a schema check waits for another process's upgrade before it gives up, saying so
LOCK_WAIT_S = 120

_meta = sa.table("gpupool_meta", sa.column("key"), sa.column("value"))


class SchemaOutdated(LedgerError):
    """The ledger's schema is older than this code's, and nobody asked to upgrade it."""


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """Alembic's configuration, without an alembic.ini: the scripts of this package, and the
    connection to run on (``env.py`` takes it) or else a URL."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    if url is not None:
        config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    return scripts().get_current_head()  # type: ignore[return-value]


def _baseline() -> ModuleType:
    return scripts().get_revision(BASELINE).module  # type: ignore[union-attr]


def _state(conn: Connection) -> tuple[set[str], int, str | None]:
    """The database's tables, its ``gpupool_meta`` schema version (0: none) and its revision."""
    tables = set(sa.inspect(conn).get_table_names())
    version = 0
    if "gpupool_meta" in tables:
        row = conn.execute(sa.select(_meta.c.value).where(_meta.c.key == "schema_version")).first()
        version = int(row[0]) if row else 0
    revision = None
    if VERSION_TABLE in tables:
        revision = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    if version > SCHEMA_VERSION or (revision is not None and not _known(revision)):
        raise LedgerError(
            f"the ledger database has schema version {version}, revision {revision or 'none'}: newer than this "
            f"gpupool_hub understands (revision {head()}); upgrade gpupool_hub"
        )
    return tables, version, revision


def _known(revision: str) -> bool:
    try:
        return scripts().get_revision(revision) is not None
    except CommandError:
        return False


def _set_meta(conn: Connection, version: int) -> None:
    updated = conn.execute(_meta.update().where(_meta.c.key == "schema_version").values(value=str(version)))
    if not updated.rowcount:
        conn.execute(_meta.insert().values(key="schema_version", value=str(version)))


def _upgrade(conn: Connection) -> list[str]:
    tables, version, revision = _state(conn)
    config = alembic_config(conn)
    done = []
    if revision is None and version == 0 and "gpupool_accounts" not in tables:
        command.upgrade(config, "head")
        _set_meta(conn, SCHEMA_VERSION)
        return [f"new database: the schema created at revision {head()}"]
    if revision is None:
        if version == 0:
            raise LedgerError("the ledger database has gpupool tables but no schema version; restore a backup")
        if version < LEGACY_VERSION:
            upgrade_to_9(conn, _baseline(), version)
            done.append(f"schema version {version} upgraded to {LEGACY_VERSION} by the hand-written steps")
        command.stamp(config, BASELINE)
        _set_meta(conn, SCHEMA_VERSION)
        done.append(f"schema version {LEGACY_VERSION} stamped at the baseline revision {BASELINE}")
        revision = BASELINE
    if revision != head():
        command.upgrade(config, "head")
        done.append(f"upgraded from revision {revision} to {head()}")
    return done


def _serialise(conn: Connection) -> None:
    """Hold the schema lock for ``conn``'s transaction: PostgreSQL's advisory lock (SQLite's writer
    transaction is ``BEGIN IMMEDIATE`` already). Another holder for :data:`LOCK_WAIT_S`: LedgerError."""
    if conn.dialect.name != "postgresql":
        return
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT_S}s'")
    try:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": UPGRADE_LOCK})
    except sa.exc.OperationalError as e:
        raise LedgerError(f"another process has been creating or upgrading the ledger's schema for over "
                          f"{LOCK_WAIT_S} s (it holds the advisory lock {UPGRADE_LOCK}); wait for it to end, "
                          f"then start again: {e.orig}") from None


def _is_empty(tables: set[str], version: int, revision: str | None) -> bool:
    return revision is None and version == 0 and "gpupool_accounts" not in tables


def _outdated(version: int, revision: str | None) -> SchemaOutdated:
    at = f"revision {revision}" if revision else f"schema version {version} (before Alembic)"
    return SchemaOutdated(
        f"the ledger database is at {at}, older than this gpupool_hub's revision {head()}; opening it does "
        f"not change it. Back it up, then run `gpupool-service upgrade-db` (it copies an SQLite file first), "
        f"or set c.GPUPoolService.upgrade_db = True to upgrade when the service starts")


def open_schema(engine: Engine, url: str | None = None, *, upgrade: bool = False) -> list[str]:
    """What every ``Ledger`` does on opening: create an empty database at head, use one at head,
    refuse a newer one, and an older one unless ``upgrade`` (then back an SQLite file at ``url`` up
    first, and :func:`migrate`). One transaction, under the schema lock. Returns what was done."""
    with engine.begin() as conn:
        _serialise(conn)
        tables, version, revision = _state(conn)
        if _is_empty(tables, version, revision) or (revision == head() and version == SCHEMA_VERSION):
            done = _upgrade(conn)
        elif not upgrade:
            raise _outdated(version, revision)
        else:
            backup = backup_sqlite(url) if url else None
            done = ([f"backed up to {backup}"] if backup else []) + _upgrade(conn)
    for line in done:
        log.info("Ledger schema: %s", line)
    return done


def migrate(engine: Engine) -> list[str]:
    """Bring the database to the head revision, in one transaction under the schema lock, and log what
    was done; refuse a database newer than this code. Returns what was done (nothing: it was at head)."""
    with engine.begin() as conn:
        _serialise(conn)
        done = _upgrade(conn)
    for line in done:
        log.info("Ledger schema: %s", line)
    return done


def pending(engine: Engine) -> bool:
    """Whether :func:`migrate` has anything to do."""
    with engine.connect() as conn:
        tables, version, revision = _state(conn)
    return revision != head() or version != SCHEMA_VERSION


def backup_sqlite(url: str, now: datetime | None = None) -> str | None:
    """Copy an SQLite ledger file next to itself, ``<file>.<YYYY-mm-dd-HHMMSS>.bak`` (mode 0600),
    with SQLite's online backup, which includes what the write-ahead log still holds. None: not
    an SQLite file (PostgreSQL, in memory) or no file yet."""
    parsed = sa.engine.make_url(normalize_url(url))
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:" or not os.path.exists(path):
        return None
    stem = f"{path}.{(now or datetime.now()).strftime('%Y-%m-%d-%H%M%S')}"
    target, n = f"{stem}.bak", 1
    while os.path.exists(target):
        target, n = f"{stem}-{n}.bak", n + 1
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(target)) as copy:
        source.backup(copy)
    return target


def upgrade_database(url: str) -> list[str]:
    """``gpupool-service upgrade-db``: back an SQLite file up (PostgreSQL: say to ``pg_dump``
    first), then :func:`migrate`. Nothing is copied when the database is at head already."""
    engine = make_engine(url)
    try:
        if not pending(engine):
            log.info("Ledger schema: at revision %s already, nothing to upgrade", head())
            return []
        backup = backup_sqlite(url)
        if backup:
            log.info("Ledger: backed up to %s", backup)
        elif engine.dialect.name != "sqlite":
            log.warning("Ledger: this command does not back up a %s database: take a dump first, e.g. "
                        "pg_dump -Fc -f gpupool-ledger.dump %s", engine.dialect.name, engine.url.database)
        return migrate(engine)
    finally:
        engine.dispose()
