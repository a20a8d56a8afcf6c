"""The ledger on real SQLite and real PostgreSQL: exact, idempotent, transactional."""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool_hub.money.credits import CreditRules, due_credits
from gpupool_hub.money.keys import entry_key
from gpupool_hub.ledger import (
    SCHEMA_VERSION,
    GpuUse,
    AuditEvent,
    IdempotencyConflict,
    Ledger,
    LedgerError,
    Posting,
    UnknownAccount,
)
from gpupool_hub.ledger.schema import accounts, meta_table
from gpupool_hub.money.pricing import PriceTable
from gpupool_hub.money.units import round_milli

UTC = timezone.utc
NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def ledger(db_url):
    ledger = Ledger(db_url)
    yield ledger
    ledger.close()


def debit(user, model, gpus, hours, table, start):
    gpu_seconds = Decimal(gpus) * Decimal(hours) * 3600
    end = start + timedelta(hours=hours)
    return Posting(
        user, "debit", -round_milli(table.cost(model, gpu_seconds)),
        entry_key("debit", user, model, start), interval_start=start, interval_end=end,
        model=model, gpu_seconds=gpu_seconds, reason=f"{gpus} × {model}",
    )


def test_worked_example_84_and_46(ledger):
    """8×2080×5 h + 4×3090×10 h + 2×A6000×3 h = 84 tokens; 100 + 30 − 84 = 46."""
    table = PriceTable.from_config({"RTX 2080": 0.5, "RTX 3090": 1, "RTX A6000": 4})
    tz = UTC
    rules = CreditRules(daily=Decimal(0))  # the example counts the grant and one monthly credit
    ledger.post_credits("alice", due_credits("alice", rules, None, datetime(2026, 11, 30, tzinfo=UTC), tz),
                        through=date(2026, 11, 30))
    ledger.post_credits("alice", due_credits("alice", rules, date(2026, 11, 30), datetime(2026, 12, 1, 9, tzinfo=UTC), tz),
                        through=date(2026, 12, 1))
    start = datetime(2026, 12, 1, 10, tzinfo=UTC)
    charges = [
        debit("alice", "NVIDIA GeForce RTX 2080", 8, 5, table, start),
        debit("alice", "NVIDIA GeForce RTX 3090", 4, 10, table, start),
        debit("alice", "NVIDIA RTX A6000", 2, 3, table, start),
    ]
    assert -sum(p.amount for p in charges) == Decimal(84)
    ledger.post_many(charges)
    assert ledger.balance("alice") == Decimal("46.000")
    assert str(ledger.balance("alice")) == "46.000"
    assert ledger.verify().ok


def test_replay_records_one_entry_and_returns_the_first(ledger):
    p = Posting("alice", "grant", Decimal(5), "grant:alice:welcome", reason="welcome", actor="admin")
    first = ledger.post(p)
    again = ledger.post(p)
    assert first.created and not again.created
    assert again.entry.id == first.entry.id
    assert ledger.balance("alice") == 5
    assert len(ledger.history("alice")) == 1


def test_key_reused_for_other_content_is_refused_and_batch_rolls_back(ledger):
    ledger.post(Posting("alice", "grant", Decimal(5), "k1"))
    with pytest.raises(IdempotencyConflict, match="k1"):
        ledger.post_many([Posting("bob", "grant", Decimal(7), "k2"), Posting("alice", "grant", Decimal(6), "k1")])
    # nothing of the failed batch was kept
    with pytest.raises(UnknownAccount):
        ledger.balance("bob")
    assert ledger.balance("alice") == 5
    assert ledger.verify().ok


def test_downtime_catch_up_credits_exactly_once(ledger):
    rules = CreditRules()
    ledger.post_credits("alice", due_credits("alice", rules, None, NOW - timedelta(days=40), UTC),
                        through=(NOW - timedelta(days=40)).date())
    acct = ledger.account("alice")
    due = due_credits("alice", rules, acct.credits_through, NOW, UTC)
    ledger.post_credits("alice", due, through=NOW.date())
    ledger.post_credits("alice", due, through=NOW.date())  # a restarted job replays it
    # an old, stale computation replayed later changes nothing either
    ledger.post_credits("alice", due_credits("alice", rules, (NOW - timedelta(days=40)).date(), NOW, UTC),
                        through=NOW.date())
    kinds = [e.kind for e in ledger.history("alice", limit=100)]
    assert kinds.count("daily") == 40 and kinds.count("monthly") == 1 and kinds.count("grant") == 1
    assert ledger.balance("alice") == 100 + 40 + 30
    assert ledger.account("alice").credits_through == NOW.date()


def test_max_balance_caps_scheduled_credits(ledger):
    rules = CreditRules(max_balance=Decimal(105))
    ledger.post_credits("alice", due_credits("alice", rules, None, NOW, UTC), through=NOW.date(),
                        max_balance=rules.max_balance)
    due = due_credits("alice", rules, NOW.date(), NOW + timedelta(days=10), UTC)
    ledger.post_credits("alice", due, through=(NOW + timedelta(days=10)).date(), max_balance=rules.max_balance)
    assert ledger.balance("alice") == 105


def test_history_is_newest_first_and_paginates(ledger):
    for i in range(7):
        ledger.post(Posting("alice", "grant", Decimal(i + 1), f"g{i}"))
    ledger.post(Posting("bob", "grant", Decimal(1), "bob-g"))
    page1 = ledger.history("alice", limit=3)
    page2 = ledger.history("alice", limit=3, before=page1[-1].id)
    page3 = ledger.history("alice", limit=3, before=page2[-1].id)
    amounts = [e.amount for e in page1 + page2 + page3]
    assert amounts == [7, 6, 5, 4, 3, 2, 1]
    assert all(e.account == "alice" for e in page1 + page2 + page3)


def test_odd_usernames_round_trip(ledger):
    for name in ["o'brien@lab", "ünïcødé", "a b;rm -rf /", 'quote"d', "x" * 255]:
        ledger.post(Posting(name, "grant", Decimal(1), entry_key("grant", name, "t")))
        assert ledger.balance(name) == 1
        assert ledger.history(name)[0].account == name


def test_a_batch_opens_the_accounts_it_names_whatever_their_names(ledger):
    """A debit cycle's batch opens missing accounts in one statement (the names as one bound
    array): odd names are opened as they are, existing ones are left as they were."""
    ledger.post(Posting("alice", "grant", Decimal(5), "g"), now=NOW - timedelta(days=3))
    names = ["alice", "o'brien@lab", "ünïcødé 🚀", "a b;rm -rf /", 'quote"d', "x" * 255, "[\"json\"]"]
    ledger.post_many([Posting(n, "grant", Decimal(2), entry_key("grant", n, "batch")) for n in names], now=NOW)
    for name in names:
        account = ledger.account(name)
        assert account.name == name
        assert account.created_at == (NOW - timedelta(days=3) if name == "alice" else NOW)
    assert ledger.balance("alice") == 7 and ledger.balance('quote"d') == 2
    assert ledger.verify().ok


def test_verify_finds_a_tampered_balance(ledger):
    ledger.post(Posting("alice", "grant", Decimal(10), "g"))
    with ledger.db.engine.begin() as conn:
        conn.execute(accounts.update().where(accounts.c.name == "alice").values(balance_milli=99))
    report = ledger.verify()
    assert not report.ok
    assert report.mismatches[0].account == "alice"
    assert report.mismatches[0].computed == 10 and report.mismatches[0].stored == Decimal("0.099")


def test_interval_marked_with_its_entries(ledger):
    start, end = NOW, NOW + timedelta(hours=1)
    ledger.post_many([Posting("alice", "debit", Decimal(-1), "d")], complete_interval=("debit", start, end))
    assert ledger.intervals.done("debit", start)
    assert not ledger.intervals.done("debit", end)
    assert ledger.intervals.last("debit") == (start, end)


def test_schema_version_is_stored_and_a_newer_database_is_refused(db_url):
    ledger = Ledger(db_url)
    with ledger.db.engine.begin() as conn:
        assert conn.execute(sa.select(meta_table.c.value)).scalar_one() == str(SCHEMA_VERSION)
        conn.execute(meta_table.update().values(value=str(SCHEMA_VERSION + 1)))
    ledger.close()
    with pytest.raises(LedgerError, match="newer"):
        Ledger(db_url)


def undo_revisions_after_the_baseline(conn) -> None:
    """What the Alembic revisions after the baseline (schema version 9) added, taken out again: a
    service of a version before them never had it."""
    for column in ("charged_from", "stop_asked_at"):  # 7b2e9c41d0a5 (issue 48.2/48.3)
        conn.execute(sa.text(f"ALTER TABLE gpupool_allocations DROP COLUMN {column}"))


def test_a_version_4_database_is_upgraded_in_place_and_keeps_its_audit_log(db_url):
    """Schema 5 adds the index that one user's audit events (their notices) are read by."""
    ledger = Ledger(db_url)
    event = ledger.audit.add(AuditEvent(NOW, "alice", "", "preempt", "reclaimed for team nlp", False, None))
    with ledger.db.engine.begin() as conn:  # back to what a version-4 service left behind
        conn.execute(sa.text("DROP TABLE gpupool_alembic_version"))  # it knew no Alembic
        undo_revisions_after_the_baseline(conn)
        conn.execute(sa.text("DROP INDEX ix_gpupool_audit_user"))
        conn.execute(meta_table.update().values(value="4"))
    ledger.close()
    ledger = Ledger(db_url, upgrade=True)  # an older schema: opened to be upgraded (issue 48.8)
    try:
        assert "ix_gpupool_audit_user" in {i["name"] for i in sa.inspect(ledger.db.engine).get_indexes("gpupool_audit")}
        with ledger.db.engine.begin() as conn:
            assert conn.execute(sa.select(meta_table.c.value)).scalar_one() == str(SCHEMA_VERSION)
        assert [e.id for e in ledger.audit.page(user="alice")] == [event.id]
    finally:
        ledger.close()


LONG_NAME = "é" * 180  # percent-encoded, 1080 characters: past the key column on PostgreSQL


def test_long_keys_are_stored_hashed_and_replays_stay_idempotent(ledger):
    """Issue 27.9: a user named 180 × "é" and an Idempotency-Key of 200 × "é"."""
    rules = CreditRules(initial=Decimal(100), daily=Decimal(1))
    due = due_credits(LONG_NAME, rules, None, NOW, UTC)
    for _ in range(2):  # a replay posts nothing
        ledger.post_credits(LONG_NAME, due, through=NOW.date())
    key = entry_key("api-grant", LONG_NAME, "é" * 200)
    assert len(key.encode()) > 2000
    first = ledger.post(Posting(LONG_NAME, "grant", Decimal(5), key, reason="long"))
    again = ledger.post(Posting(LONG_NAME, "grant", Decimal(5), key, reason="long"))
    assert first.created and not again.created and again.entry.id == first.entry.id
    assert again.entry.key == first.entry.key == key  # the full key, not its hash
    with pytest.raises(IdempotencyConflict):
        ledger.post(Posting(LONG_NAME, "grant", Decimal(6), key))
    assert ledger.balance(LONG_NAME) == Decimal(105)  # the initial grant and this one
    assert [e.key for e in ledger.history(LONG_NAME)][0] == key
    assert ledger.verify().ok


def test_a_version_5_database_is_upgraded_and_its_long_keys_still_match(db_url):
    """Schema 6 keeps long keys hashed with the full key beside them, and remembers nodes'
    devices. A key SQLite took whole before (PostgreSQL only up to 1024 characters, so
    there: 600 × "é", 1200 bytes) is moved to its hash, so a replay still finds it."""
    long_key = "grant:" + ("x" * 1500 if db_url.startswith("sqlite") else "é" * 600)
    ledger = Ledger(db_url)
    with ledger.db.engine.begin() as conn:  # back to what a version-5 service left behind
        conn.execute(sa.text("DROP TABLE gpupool_alembic_version"))  # it knew no Alembic
        undo_revisions_after_the_baseline(conn)
        conn.execute(sa.text("DROP TABLE gpupool_node_devices"))
        conn.execute(sa.text("ALTER TABLE gpupool_entries DROP COLUMN key_text"))
        conn.execute(meta_table.update().values(value="5"))
        conn.execute(accounts.insert().values(name="alice", balance_milli=7000, created_at=NOW.replace(tzinfo=None)))
        conn.execute(sa.text("INSERT INTO gpupool_entries (account, kind, amount_milli, idempotency_key, reason, "
                             "actor, created_at) VALUES ('alice', 'grant', 7000, :k, 'old', 'system', :t)"),
                     {"k": long_key, "t": NOW.replace(tzinfo=None)})
    ledger.close()
    ledger = Ledger(db_url, upgrade=True)  # an older schema: opened to be upgraded (issue 48.8)
    try:
        with ledger.db.engine.begin() as conn:
            assert conn.execute(sa.select(meta_table.c.value)).scalar_one() == str(SCHEMA_VERSION) == "10"
        replay = ledger.post(Posting("alice", "grant", Decimal(7), long_key))
        assert not replay.created and replay.entry.key == long_key and replay.entry.reason == "old"
        assert ledger.balance("alice") == Decimal(7) and ledger.verify().ok
        ledger.nodes.set_devices("n1", ["GPU-1", "MIG-1"], NOW)
        assert ledger.nodes.devices() == {"GPU-1": "n1", "MIG-1": "n1"}
        # version 7: the GPU-use record, written once per interval
        use = [GpuUse(NOW.date(), "alice", "", 60_000, 30_000, 0)]
        interval = ("gpu-use", NOW, NOW + timedelta(minutes=1))
        assert ledger.gpu_use.record(use, interval) and not ledger.gpu_use.record(use, interval)
        assert ledger.reports.gpu_use_of("alice", NOW.date(), NOW.date())[NOW.date()].idle_milli == 30_000
    finally:
        ledger.close()


def test_a_version_8_database_keeps_its_shown_estimates_and_calibrates_on_new_ones(db_url):
    """Schema 9 keeps the model's own estimate beside each shown one; the estimates a
    version-8 service recorded still count for the published accuracy."""
    ledger = Ledger(db_url)
    with ledger.db.engine.begin() as conn:  # back to what a version-8 service left behind
        conn.execute(sa.text("DROP TABLE gpupool_alembic_version"))  # it knew no Alembic
        undo_revisions_after_the_baseline(conn)
        conn.execute(sa.text("ALTER TABLE gpupool_estimates DROP COLUMN model_s"))
        conn.execute(meta_table.update().values(value="8"))
        conn.execute(sa.text("INSERT INTO gpupool_estimates (id, \"user\", shown_at, low_s, mid_s, high_s, basis, "
                             "started_at) VALUES ('old', 'ann', :shown, 60, 120, 300, 'history', :started)"),
                     {"shown": NOW.replace(tzinfo=None), "started": (NOW + timedelta(minutes=3)).replace(tzinfo=None)})
    ledger.close()
    ledger = Ledger(db_url, upgrade=True)  # an older schema: opened to be upgraded (issue 48.8)
    try:
        since = NOW - timedelta(days=1)
        assert ledger.queue.started_estimates(since) == [(60, 120, 300, 180.0)]
        assert ledger.queue.calibration_pairs(since, 10) == []  # nothing to calibrate on from before
        for i, model_s in enumerate((100, 200, 300)):
            ledger.queue.estimate_shown(f"e{i}", "bob", NOW + timedelta(minutes=i), [60, 120, 300], "history", model_s)
            ledger.queue.estimate_started(f"e{i}", NOW + timedelta(minutes=i + 5))
        assert ledger.queue.calibration_pairs(since, 2) == [(200, 300.0), (300, 300.0)]  # the latest, oldest first
    finally:
        ledger.close()


def test_bad_postings_are_refused_before_touching_the_database():
    with pytest.raises(ValueError):
        Posting("alice", "debit", Decimal(1), "k")  # a debit cannot add tokens
    with pytest.raises(ValueError):
        Posting("alice", "grant", Decimal("0.0001"), "k")  # finer than a milli-token
    with pytest.raises(ValueError):
        Posting("alice", "gift", Decimal(1), "k")


def _hammer(url: str, worker: int, n: int) -> None:
    ledger = Ledger(url)
    for i in range(n):
        # both workers post the same keys (replays) and their own keys
        ledger.post(Posting("shared", "grant", Decimal(1), f"both:{i}"))
        ledger.post(Posting("shared", "grant", Decimal(2), f"own:{worker}:{i}"))
    ledger.close()


def test_two_processes_posting_at_once(db_url):
    Ledger(db_url).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(db_url, w, 40)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ledger = Ledger(db_url)
    assert ledger.balance("shared") == 40 * 1 + 2 * 40 * 2
    assert len(ledger.history("shared", limit=1000)) == 40 + 80
    assert ledger.verify().ok


# ------------------------------------------------------------------ property

operations = st.lists(
    st.tuples(
        st.sampled_from(["alice", "bob", "o'brien"]),
        st.integers(min_value=0, max_value=12),  # key id: small range forces replays
        st.booleans(),  # replay as part of a batch?
    ),
    min_size=1,
    max_size=30,
)


def _amount(user: str, key_id: int) -> Decimal:
    return Decimal(key_id * 7 % 11 - 5 or 1) / 8  # deterministic per key, either sign


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_any_interleaving_of_posts_and_replays_keeps_books_exact(ledger, ops):
    run = uuid.uuid4().hex[:8]  # isolate examples sharing one database
    expected: dict[str, dict[str, Decimal]] = {}
    batch: list[Posting] = []

    def flush():
        if batch:
            ledger.post_many(list({p.key: p for p in batch}.values()))
            batch.clear()

    for user, key_id, batched in ops:
        account = f"{run}-{user}"
        amount = _amount(user, key_id)
        key = f"{run}:{user}:{key_id}"
        posting = Posting(account, "adjustment", amount, key)
        expected.setdefault(account, {})[key] = amount
        if batched:
            batch.append(posting)
        else:
            flush()
            ledger.post(posting)
    flush()
    for account, keys in expected.items():
        assert ledger.balance(account) == sum(keys.values())
        history = ledger.history(account, limit=1000)
        assert sorted(e.key for e in history) == sorted(keys)  # no key twice, none lost
    assert ledger.verify().ok


# ------------------------------------------------------------- issue 12, item 3

HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_12_3_writes_give_up_within_the_bound_and_reads_do_not_wait(tmp_path):
    """Another process holds the SQLite write lock: reads answer at once, a write
    raises LedgerBusy after busy_timeout (not 30 s), and succeeds once it is free."""
    import subprocess
    import sys
    import time

    from gpupool_hub.ledger import LedgerBusy, write_deadline

    db = tmp_path / "ledger.sqlite"
    ledger = Ledger(f"sqlite:///{db}", busy_timeout=0.5)
    ledger.post(Posting("alice", "grant", Decimal(1), "before"))
    with ledger.db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    assert ledger.db.reader is not ledger.db.engine  # reads on connections of their own
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t = time.monotonic()
        assert ledger.balance("alice") == 1 and ledger.history("alice")[0].key == "before"
        assert ledger.verify().ok
        assert time.monotonic() - t < 0.3
        t = time.monotonic()
        with pytest.raises(LedgerBusy) as busy:
            ledger.post(Posting("alice", "grant", Decimal(2), "during"))
        assert 0.4 < time.monotonic() - t < 2 and busy.value.retry_after == 1
        # a deadline already spent gives up without waiting at all
        t = time.monotonic()
        with write_deadline(time.monotonic() - 1), pytest.raises(LedgerBusy):
            ledger.post(Posting("alice", "grant", Decimal(2), "during"))
        assert time.monotonic() - t < 0.2
    finally:
        holder.communicate("\n", timeout=10)
    assert ledger.post(Posting("alice", "grant", Decimal(2), "during")).created
    assert ledger.balance("alice") == 3 and ledger.verify().ok


# ---- the jobs lease (service/core/jobs_lease.py)

def test_a_lease_has_one_holder_until_it_expires_or_its_holder_is_gone(ledger):
    now = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
    assert ledger.leases.claim("jobs", "a", 30, now=now) == "a"
    assert ledger.leases.claim("jobs", "b", 30, now=now + timedelta(seconds=10)) == "a"
    assert ledger.leases.claim("jobs", "a", 30, now=now + timedelta(seconds=20)) == "a"  # renewed to 12:00:50
    assert ledger.leases.claim("jobs", "b", 30, now=now + timedelta(seconds=45)) == "a"
    assert ledger.leases.claim("jobs", "b", 30, now=now + timedelta(seconds=51)) == "b"  # expired
    assert ledger.leases.claim("jobs", "a", 30, now=now + timedelta(seconds=52),
                               holder_gone=lambda h: h == "b") == "a"  # b died
    ledger.leases.release("jobs", "b")  # not b's any more: nothing happens
    assert ledger.leases.claim("jobs", "b", 30, now=now + timedelta(seconds=53)) == "a"
    ledger.leases.release("jobs", "a")
    assert ledger.leases.claim("jobs", "b", 30, now=now + timedelta(seconds=54)) == "b"


def test_balances_of_many_users_in_one_read(ledger):
    """The cull job reads every holder's balance at once: more names than one query takes
    (500 a chunk), an unknown name left out rather than failing the others."""
    for i in range(1200):
        ledger.post(Posting(f"user{i:04d}", "grant", Decimal(i + 1) / 1000, f"grant-{i}"))
    names = [f"user{i:04d}" for i in range(1200)] + ["nobody", "user0007"]
    balances = ledger.balances(names)
    assert len(balances) == 1200 and "nobody" not in balances
    assert balances["user0007"] == Decimal("0.008") == ledger.balance("user0007")
    assert balances["user1199"] == Decimal("1.2")
    assert ledger.balances([]) == {}


def _entries_in_file_alone(db: Path, tmp_path: Path) -> int:
    """Entries the database file holds without its write-ahead log (as a copy of the file alone
    would show): what a checkpoint has copied into it so far."""
    copy = tmp_path / f"copy-{uuid.uuid4().hex}.sqlite"
    shutil.copyfile(db, copy)
    with sqlite3.connect(copy) as conn:
        return conn.execute("SELECT COUNT(*) FROM gpupool_entries").fetchone()[0]


@pytest.mark.parametrize("background", [False, True])
def test_with_background_checkpoints_writes_leave_the_wal_to_the_checkpoint(tmp_path, background):
    db = tmp_path / "ledger.sqlite"
    ledger = Ledger(f"sqlite:///{db}", background_checkpoints=background)
    try:
        ledger.open_account("alice", now=NOW)
        assert ledger.db.checkpoint() == 0  # the schema and the account are in the file now
        for i in range(600):  # a few thousand pages of WAL: past SQLite's own 1,000-page checkpoint
            ledger.post(Posting("alice", "grant", Decimal(1), f"grant-{i}", reason="x" * 2000), now=NOW)
        in_file = _entries_in_file_alone(db, tmp_path)
        if background:
            assert in_file == 0  # no write paid for copying the log into the file
        else:
            assert in_file > 0  # some write did
        assert ledger.db.checkpoint() == 0
        assert _entries_in_file_alone(db, tmp_path) == 600
        assert ledger.balance("alice") == Decimal(600)
    finally:
        ledger.close()


def test_checkpoint_is_a_no_op_without_a_write_ahead_log(postgres_url):
    ledger = Ledger(postgres_url, background_checkpoints=True)
    try:
        assert ledger.db.checkpoint() == 0
    finally:
        ledger.close()


@pytest.mark.parametrize(
    ("parts", "key"),
    [
        (("alice", "NVIDIA A100", datetime(2026, 11, 21, 10, tzinfo=timezone.utc)),
         "debit:alice:NVIDIA%20A100:2026-11-21T10:00:00Z"),
        (("a:b", "x/y", datetime(2026, 11, 21, 11, 30, tzinfo=timezone(timedelta(hours=1)))),
         "debit:a%3Ab:x%2Fy:2026-11-21T10:30:00Z"),  # ":" in a name cannot split a key
        (("o'brien@lab", "ünï", date(2026, 11, 21)), "debit:o%27brien%40lab:%C3%BCn%C3%AF:2026-11-21"),
        (("a.b_c-d~e", 7, "%41"), "debit:a.b_c-d~e:7:%2541"),
    ],
)
def test_keys_name_the_fact_whatever_the_name(parts, key) -> None:
    """A debit cycle keys 10,000 debits through a fast path; the keys stay the ones in the ledger."""
    assert entry_key("debit", *parts) == key
    assert entry_key("debit", *parts) == key  # cached parts give the same key
