"""The released hand-written steps that brought schema versions 1 to 8 to version 9, frozen.

Before Alembic, ``gpupool_meta``'s ``schema_version`` row said which of these a database
had run. They are kept only to bring such a database to version 9, which the baseline
revision then stands for; they are never edited and no step is added (a schema change is
a revision in ``versions/``). Each step creates its tables with the baseline's own frozen
functions (``create_accounts``, ...), never from ``schema.py``: the released steps built
them from the tables of their day, which were version 9's, and so do these.
"""

from __future__ import annotations

from types import ModuleType

import sqlalchemy as sa
from alembic import op
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from ...money.keys import MAX_KEY_BYTES, stored_key

#: the last hand-written schema version: the one the baseline revision creates
LEGACY_VERSION = 9

#: version -> the baseline's functions that create the tables that version added
_NEW_TABLES = {
    1: ("accounts", "entries", "intervals"),
    2: ("allocations", "carries"),
    3: ("audit",),
    4: ("queue",),
    6: ("node_devices",),
    7: ("gpu_use",),
    8: ("estimates",),
}

# the columns of entries that step 6 rewrites (a long key is stored the way a replay looks it up: keys.stored_key)
_entries = sa.table("gpupool_entries", sa.column("id"), sa.column("idempotency_key"), sa.column("key_text"))


def _columns(conn: Connection, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(conn).get_columns(table)}


def _step_5(conn: Connection, baseline: ModuleType) -> None:
    # a database made at version 3 or later has the audit table without this index;
    # one made from scratch got it with the table in step 3
    if "ix_gpupool_audit_user" not in {i["name"] for i in sa.inspect(conn).get_indexes("gpupool_audit")}:
        baseline.create_audit_index()


def _step_6(conn: Connection, baseline: ModuleType) -> None:
    # long keys are stored hashed, the full key beside them; a database made from scratch has key_text already
    if "key_text" not in _columns(conn, "gpupool_entries"):
        op.add_column("gpupool_entries", sa.Column("key_text", sa.UnicodeText, nullable=True))
    # SQLite took keys of any length before: store those the way a replay now looks them up
    long_keys = sa.select(_entries.c.id, _entries.c.idempotency_key).where(sa.or_(
        sa.func.length(_entries.c.idempotency_key) > MAX_KEY_BYTES // 4,  # 4 bytes a character at most
        _entries.c.idempotency_key.like("sha256:%")))
    for entry_id, key in conn.execute(long_keys).all():
        if stored_key(key) != key:
            conn.execute(_entries.update().where(_entries.c.id == entry_id)
                         .values(idempotency_key=stored_key(key), key_text=key))


def _step_9(conn: Connection, baseline: ModuleType) -> None:
    # the model's own estimate beside each shown one; a database made from scratch has it already
    if "model_s" not in _columns(conn, "gpupool_estimates"):
        op.add_column("gpupool_estimates", sa.Column("model_s", sa.Integer, nullable=True))


_STEPS = {5: _step_5, 6: _step_6, 9: _step_9}


def upgrade_to_9(conn: Connection, baseline: ModuleType, version: int, up_to: int = LEGACY_VERSION) -> None:
    """Run the released steps after ``version`` up to ``up_to`` (9; the tests stop earlier to
    make a database of an older version), in the caller's transaction, creating ``gpupool_meta``
    on an empty database. ``baseline``: the baseline revision's module. The caller stores the version."""
    with Operations.context(MigrationContext.configure(conn)):
        if "gpupool_meta" not in sa.inspect(conn).get_table_names():
            baseline.create_meta()
        for step in range(version + 1, up_to + 1):
            existing = set(sa.inspect(conn).get_table_names())
            for name in _NEW_TABLES.get(step, ()):
                if f"gpupool_{name}" not in existing:  # the released steps created only what was missing
                    getattr(baseline, f"create_{name}")()
            if step in _STEPS:
                _STEPS[step](conn, baseline)
