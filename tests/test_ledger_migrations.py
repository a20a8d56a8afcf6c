"""The ledger's schema upgrades (issue 38): every released schema version reaches Alembic's
head with its rows, head is exactly ``schema.py``, and ``gpupool-service upgrade-db`` backs an
SQLite file up first. Each runs on SQLite and on a real PostgreSQL (tests/fixtures/postgres.py).

A database of version N is made by today's code: the frozen hand-written steps up to N
(``migrations/legacy.py``), as a service of that version left it (no Alembic revision)."""

from __future__ import annotations

import logging
import sqlite3
from datetime import datetime
from decimal import Decimal

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpupool_hub.ledger import SCHEMA_VERSION, Ledger, LedgerError, Posting, upgrade_database
from gpupool_hub.ledger.engine import make_engine
from gpupool_hub.ledger.migrations import BASELINE, VERSION_TABLE, _baseline, head, legacy, migrate
from gpupool_hub.ledger.schema import metadata
from gpupool_hub.service.app import main as service_main

CREATED = datetime(2026, 11, 1, 12, 0)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return request.getfixturevalue("postgres_url")


def make_version(url: str, version: int) -> None:
    """A database at schema ``version`` holding alice's account with one grant of 7 tokens."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            legacy.upgrade_to_9(conn, _baseline(), 0, up_to=version)
            conn.execute(sa.text("INSERT INTO gpupool_meta (key, value) VALUES ('schema_version', :v)"),
                         {"v": str(version)})
            conn.execute(sa.text("INSERT INTO gpupool_accounts (name, balance_milli, created_at) "
                                 "VALUES ('alice', 7000, :t)"), {"t": CREATED})
            conn.execute(sa.text("INSERT INTO gpupool_entries (account, kind, amount_milli, idempotency_key, reason, "
                                 "actor, created_at) VALUES ('alice', 'grant', 7000, 'grant:alice:1', 'old', "
                                 "'system', :t)"), {"t": CREATED})
    finally:
        engine.dispose()


def state(engine: sa.engine.Engine) -> tuple[str, str, list]:
    """The stored revision, gpupool_meta's version and what autogenerate finds between the
    database and ``schema.py``."""
    with engine.connect() as conn:
        revision = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
        version = conn.execute(sa.text("SELECT value FROM gpupool_meta WHERE key = 'schema_version'")).scalar_one()
        diff = compare_metadata(MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}), metadata)
    return revision, version, diff


@pytest.mark.parametrize("version", range(1, 10))
def test_every_schema_version_upgrades_to_head_and_keeps_its_rows(url, version):
    make_version(url, version)
    ledger = Ledger(url)  # what the service does at start
    try:
        assert state(ledger.db.engine) == (head(), str(SCHEMA_VERSION), [])
        assert ledger.balance("alice") == Decimal(7) and ledger.verify().ok
        assert [e.reason for e in ledger.history("alice")] == ["old"]
        replay = ledger.post(Posting("alice", "grant", Decimal(7), "grant:alice:1", reason="old"))
        assert not replay.created
        ledger.post(Posting("alice", "debit", Decimal(-2), "debit:alice:1"))
        assert ledger.balance("alice") == Decimal(5) and ledger.verify().ok
    finally:
        ledger.close()


def test_a_new_database_at_head_is_exactly_schema_py(url):
    ledger = Ledger(url)
    try:
        assert state(ledger.db.engine) == (head(), str(SCHEMA_VERSION), [])
    finally:
        ledger.close()


def test_upgrading_twice_is_harmless(url):
    make_version(url, 4)
    engine = make_engine(url)
    try:
        assert len(migrate(engine)) == 2  # the steps to 9, the stamp
        assert migrate(engine) == [] and upgrade_database(url) == []
        assert state(engine) == (head(), str(SCHEMA_VERSION), [])
    finally:
        engine.dispose()
    ledger = Ledger(url)
    try:
        assert ledger.balance("alice") == Decimal(7) and ledger.verify().ok
    finally:
        ledger.close()


def test_a_database_of_a_revision_this_code_does_not_know_is_refused(url):
    Ledger(url).close()
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffffffffffff'"))
    finally:
        engine.dispose()
    with pytest.raises(LedgerError, match="newer"):
        Ledger(url)


def test_the_upgrade_command_backs_an_sqlite_file_up_first(tmp_path, capsys):
    path = tmp_path / "gpupool.sqlite"
    make_version(f"sqlite:///{path}", 8)
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(f"c.GPUPool.db_url = 'sqlite:///{path}'\n")
    service_main(["upgrade-db", "--config", str(config)])
    assert "stamped at the baseline" in capsys.readouterr().out
    [backup] = tmp_path.glob("gpupool.sqlite.*.bak")
    with sqlite3.connect(backup) as copy:  # the database as it was before the upgrade
        assert copy.execute("SELECT value FROM gpupool_meta").fetchall() == [("8",)]
        assert copy.execute("SELECT amount_milli FROM gpupool_entries").fetchall() == [(7000,)]
    assert backup.stat().st_mode & 0o077 == 0
    service_main(["upgrade-db", "--config", str(config)])  # at head: no second copy
    assert "already" in capsys.readouterr().out
    assert list(tmp_path.glob("gpupool.sqlite.*.bak")) == [backup]


def test_the_upgrade_command_tells_to_pg_dump_a_postgresql_database_first(postgres_url, caplog):
    make_version(postgres_url, 9)
    with caplog.at_level(logging.INFO, logger="gpupool_hub.ledger"):
        done = upgrade_database(postgres_url)
    assert done[0] == f"schema version 9 stamped at the baseline revision {BASELINE}"
    assert "pg_dump" in caplog.text
