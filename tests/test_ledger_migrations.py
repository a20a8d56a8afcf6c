"""The ledger's schema upgrades (issue 38): every released schema version reaches Alembic's
head with its rows, head is exactly ``schema.py``, and ``gpupool-service upgrade-db`` backs an
SQLite file up first. Each runs on SQLite and on a real PostgreSQL (tests/fixtures/postgres.py).

A database of version N is made by today's code: the frozen hand-written steps up to N
(``migrations/legacy.py``), as a service of that version left it (no Alembic revision)."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
from datetime import datetime
from decimal import Decimal

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpupool_hub.ledger import SCHEMA_VERSION, Ledger, LedgerError, Posting, SchemaOutdated, upgrade_database
from gpupool_hub.ledger import migrations
from gpupool_hub.ledger.database import make_engine, normalize_url
from gpupool_hub.ledger.migrations import BASELINE, UPGRADE_LOCK, VERSION_TABLE, _baseline, head, legacy, migrate
from gpupool_hub.ledger.schema import metadata
from gpupool_hub.service.app import GPUPoolService
from gpupool_hub.service.app import main as service_main
from tests.fixtures.hub import wait_for

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
    ledger = Ledger(url, upgrade=True)  # what the service does at start with upgrade_db, or upgrade-db does
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


def stored_version(url: str) -> tuple[list[str], str | None]:
    """The tables and gpupool_meta's schema_version, read without gpupool_hub's engine."""
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            tables = sorted(sa.inspect(conn).get_table_names())
            version = conn.execute(sa.text("SELECT value FROM gpupool_meta WHERE key = 'schema_version'")).scalar()
        return tables, version
    finally:
        engine.dispose()


@pytest.mark.parametrize("version", [4, 9])
def test_opening_an_older_ledger_changes_nothing_and_names_the_upgrade(url, version):
    """Issue 48.8: ``Ledger()`` migrated at every construction, so any process that opened the ledger
    upgraded it, unasked and unbacked-up. As JupyterHub's check_db_revision: refused, naming the command."""
    make_version(url, version)
    before = stored_version(url)
    with pytest.raises(SchemaOutdated) as e:
        Ledger(url)
    assert f"schema version {version} (before Alembic), older than this gpupool_hub's revision" in str(e.value)
    assert "gpupool-service upgrade-db" in str(e.value) and "c.GPUPoolService.upgrade_db" in str(e.value)
    assert stored_version(url) == before and VERSION_TABLE not in before[0]


def test_upgrading_on_open_backs_an_sqlite_file_up_first(tmp_path):
    path = tmp_path / "gpupool.sqlite"
    make_version(f"sqlite:///{path}", 8)
    ledger = Ledger(f"sqlite:///{path}", upgrade=True)
    try:
        assert ledger.balance("alice") == Decimal(7)
    finally:
        ledger.close()
    [backup] = tmp_path.glob("gpupool.sqlite.*.bak")
    with sqlite3.connect(backup) as copy:  # the database as it was before the upgrade
        assert copy.execute("SELECT value FROM gpupool_meta").fetchall() == [("8",)]
    Ledger(f"sqlite:///{path}", upgrade=True).close()  # at head: no second copy
    assert list(tmp_path.glob("gpupool.sqlite.*.bak")) == [backup]


UPGRADER = """
import sys
from gpupool_hub.ledger import Ledger
Ledger(sys.argv[1], upgrade=True).close()
print("upgraded")
"""


def test_two_upgrades_forced_to_overlap_on_postgresql_both_end_well(postgres_url, tmp_path):
    """Issue 48.8: two upgrades at once crashed one process with a raw IntegrityError. Both processes are
    started while the test holds the schema lock, so both reach it before either may go on: the first
    upgrades, the second waits, then finds the schema at head. Neither fails; the rows are there once."""
    make_version(postgres_url, 4)
    holder = sa.create_engine(normalize_url(postgres_url))
    procs = []
    try:
        with holder.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": UPGRADE_LOCK})
            procs = [subprocess.Popen([sys.executable, "-c", UPGRADER, postgres_url], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
                     for _ in range(2)]

            def both_wait() -> bool:
                waiting = conn.execute(sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).scalar()
                return waiting == 2

            wait_for(both_wait, 60, "both upgrades to wait for the schema lock")
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": UPGRADE_LOCK})
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        assert all("IntegrityError" not in out for out in outputs), outputs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        holder.dispose()
    ledger = Ledger(postgres_url)
    try:
        assert state(ledger.db.engine) == (head(), str(SCHEMA_VERSION), [])
        assert ledger.balance("alice") == Decimal(7) and [e.reason for e in ledger.history("alice")] == ["old"]
    finally:
        ledger.close()


def test_an_upgrade_that_waits_too_long_says_another_one_is_running(postgres_url, monkeypatch):
    make_version(postgres_url, 9)
    monkeypatch.setattr(migrations, "LOCK_WAIT_S", 1)
    holder = sa.create_engine(normalize_url(postgres_url))
    try:
        with holder.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": UPGRADE_LOCK})
            with pytest.raises(LedgerError, match="another process has been creating or upgrading the ledger"):
                Ledger(postgres_url, upgrade=True)
    finally:
        holder.dispose()


def test_the_service_refuses_an_older_ledger_unless_told_to_upgrade(tmp_path, monkeypatch):
    path = tmp_path / "gpupool.sqlite"
    make_version(f"sqlite:///{path}", 9)
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(f"c.GPUPool.db_url = 'sqlite:///{path}'\n")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
    with pytest.raises(SystemExit, match="gpupool-service upgrade-db"):
        GPUPoolService().initialize(["--config", str(config)])
    assert stored_version(f"sqlite:///{path}")[1] == "9"
    service = GPUPoolService()
    try:
        service.initialize(["--config", str(config), "--GPUPoolService.upgrade_db=True"])
        assert service.ledger.balance("alice") == Decimal(7)
    finally:
        if getattr(service, "ledger", None) is not None:
            service.ledger.close()
    assert len(list(tmp_path.glob("gpupool.sqlite.*.bak"))) == 1


def test_allocations_of_an_older_ledger_are_charged_from_their_creation(url):
    """Revision 7b2e9c41d0a5 (issue 48.2/48.3): every allocation so far was charged from its creation."""
    make_version(url, 9)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO gpupool_allocations (id, \"user\", server, node, gpus, request, price_per_hour_milli, "
                "borrowed, created_at) VALUES ('a1', 'alice', '', 'n1', '[]', '{}', 1000, false, :t)"), {"t": CREATED})
    finally:
        engine.dispose()
    ledger = Ledger(url, upgrade=True)
    try:
        [held] = ledger.allocations.active()
        assert held.charged_from == held.created_at and held.stop_asked_at is None
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
        assert len(migrate(engine)) == 3  # the steps to 9, the stamp, the revisions after the baseline
        assert migrate(engine) == [] and upgrade_database(url) == []
        assert state(engine) == (head(), str(SCHEMA_VERSION), [])
    finally:
        engine.dispose()
    ledger = Ledger(url)  # at head now: opening it needs no upgrade
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
