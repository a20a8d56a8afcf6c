"""The ledger's schema versions and the hand-written steps between them, moved here as they
were (each table's definition is in ``schema.py``). Released steps are never edited: a schema
change adds a step and bumps ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..keys import MAX_KEY_BYTES, stored_key
from .engine import LedgerError
from .schema import (accounts, allocations, audit, carries, entries, estimates, gpu_use, intervals, meta_table,
                     metadata, node_devices, queue)

log = logging.getLogger(__name__)

#: Current schema version; see ``MIGRATIONS`` and docs/ledger.md for the upgrade path.
SCHEMA_VERSION = 9


def _migrate_to_1(conn: Connection) -> None:
    metadata.create_all(conn, tables=[accounts, entries, intervals])


#: version -> step that upgrades from version-1. Add a step (and bump
#: SCHEMA_VERSION) for every schema change; never edit a released step.
def _migrate_to_2(conn: Connection) -> None:
    metadata.create_all(conn, tables=[allocations, carries])


def _migrate_to_3(conn: Connection) -> None:
    metadata.create_all(conn, tables=[audit])


def _migrate_to_4(conn: Connection) -> None:
    metadata.create_all(conn, tables=[queue])


def _migrate_to_5(conn: Connection) -> None:
    # a database made at version 3 or later has the audit table without this index;
    # one made from scratch got it with the table in step 3
    for index in audit.indexes:
        index.create(conn, checkfirst=True)


def _migrate_to_6(conn: Connection) -> None:
    # long keys are stored hashed, the full key beside them (keys.stored_key); nodes'
    # devices are remembered (node_devices). A database made from scratch has both already.
    if "key_text" not in {c["name"] for c in sa.inspect(conn).get_columns("gpupool_entries")}:
        conn.execute(sa.text("ALTER TABLE gpupool_entries ADD COLUMN key_text TEXT"))
    metadata.create_all(conn, tables=[node_devices])
    # SQLite took keys of any length before: store those the way a replay now looks them up
    long_keys = sa.select(entries.c.id, entries.c.idempotency_key).where(sa.or_(
        sa.func.length(entries.c.idempotency_key) > MAX_KEY_BYTES // 4,  # 4 bytes a character at most
        entries.c.idempotency_key.like("sha256:%")))
    for entry_id, key in conn.execute(long_keys).all():
        if stored_key(key) != key:
            conn.execute(entries.update().where(entries.c.id == entry_id)
                         .values(idempotency_key=stored_key(key), key_text=key))


def _migrate_to_7(conn: Connection) -> None:
    metadata.create_all(conn, tables=[gpu_use])


def _migrate_to_8(conn: Connection) -> None:
    # the queue's shown estimates and real starts (their published accuracy)
    metadata.create_all(conn, tables=[estimates])


def _migrate_to_9(conn: Connection) -> None:
    # the model's own estimate beside each shown one: the service calibrates on it
    if "model_s" not in {c["name"] for c in sa.inspect(conn).get_columns("gpupool_estimates")}:
        conn.execute(sa.text("ALTER TABLE gpupool_estimates ADD COLUMN model_s INTEGER"))


MIGRATIONS = {1: _migrate_to_1, 2: _migrate_to_2, 3: _migrate_to_3, 4: _migrate_to_4, 5: _migrate_to_5,
              6: _migrate_to_6, 7: _migrate_to_7, 8: _migrate_to_8, 9: _migrate_to_9}


def schema_version(conn: Connection) -> int:
    row = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")).first()
    return int(row[0]) if row else 0


def migrate(engine: Engine) -> int:
    """Bring the schema to ``SCHEMA_VERSION``; refuse a database newer than this code."""
    with engine.begin() as conn:
        meta_table.create(conn, checkfirst=True)
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            raise LedgerError(
                f"the ledger database has schema version {current}, newer than this gpupool_hub "
                f"understands ({SCHEMA_VERSION}); upgrade gpupool_hub"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            log.info("Upgrading the ledger schema to version %d", version)
            MIGRATIONS[version](conn)
        if current != SCHEMA_VERSION:
            if current == 0:
                conn.execute(meta_table.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
            else:
                conn.execute(
                    meta_table.update().where(meta_table.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
                )
    return SCHEMA_VERSION
