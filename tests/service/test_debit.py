"""Debits from a real Prometheus: exact tokens, outages, and a crash mid catch-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from gpupool_hub.ledger import Ledger
from gpupool_hub.ledger.schema import intervals
from gpupool_hub.service.core.manager import PoolManager
from gpupool_hub.usage.prometheus import PrometheusUsageSource
from tests.fixtures.manager import Clock, make_manager as make_core
from tests.fixtures.prometheus import history_base, usage_table_history
from tests.fixtures.ports import free_port as _free_port

pytestmark = pytest.mark.integration

A6000 = "NVIDIA RTX A6000"
R3090 = "NVIDIA GeForce RTX 3090"
ODD = "o'brien ü"
H = timedelta(hours=1)
PRICES = {"RTX 2080": 0.5, "RTX 3090": 1, "RTX A6000": 4}
NODES = [{"name": "n1", "cpu_milli": 64000, "memory_mib": 65536, "gpus": {"count": 4, "model": A6000}},
         {"name": "n2", "cpu_milli": 64000, "memory_mib": 65536, "gpus": {"count": 4, "model": R3090}}]


def usage_table(base):
    return {
        ("alice", A6000): [(base, base + 3 * H, 2)],                                 # 2 × 4 × 3 = 24
        ("alice", R3090): [(base, base + H, 1)],                                     # 1
        ("bob", A6000): [(base + H, base + 2 * H, 0.25)],                            # 0.25 × 4 = 1
        (ODD, R3090): [(base + timedelta(minutes=30), base + timedelta(minutes=150), 1)],  # 2
    }


EXPECTED = {"alice": Decimal(-25), "bob": Decimal(-1), ODD: Decimal(-2)}


@pytest.fixture(scope="module")
def history():
    base = history_base(3)
    return base, usage_table_history(usage_table(base))


def make_manager(tmp_path, source, clock, base) -> PoolManager:
    # charging starts at the history's first hour
    return make_core(NODES, PRICES, f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock, usage_source=source,
                     epoch=base)


def balances(ledger):
    return {a.name: a.balance for a in ledger.accounts(limit=100)}


def test_exact_tokens_for_a_known_history(tmp_path, prometheus_factory, history):
    base, hist = history
    prom = prometheus_factory(hist)
    clock = Clock(base + 4 * H + timedelta(minutes=5))
    source = PrometheusUsageSource(prom.url, "gpupool", settle_seconds=120, clock=clock)
    manager = make_manager(tmp_path, source, clock, base)
    assert manager.debits.debit_due() == 4
    assert balances(manager.ledger) == EXPECTED
    assert manager.debits.debit_due() == 0  # nothing twice
    assert balances(manager.ledger) == EXPECTED
    assert manager.ledger.verify().ok
    me = manager.views.me("alice")
    assert me["last_debit_at"] == (base + 4 * H).strftime("%Y-%m-%dT%H:%M:%SZ")
    # per-interval entries carry what was used
    debits = [e for e in manager.ledger.history("alice", limit=50) if e.kind == "debit"]
    assert sorted((e.interval_start, e.model, e.amount) for e in debits) == sorted(
        [(base, A6000, Decimal(-8)), (base + H, A6000, Decimal(-8)), (base + 2 * H, A6000, Decimal(-8)),
         (base, R3090, Decimal(-1))])


def test_prometheus_outage_of_three_intervals_charges_each_exactly_once(tmp_path, prometheus_factory, history):
    base, hist = history
    prom = prometheus_factory(hist)
    clock = Clock(base + H + timedelta(minutes=5))
    source = PrometheusUsageSource(prom.url, "gpupool", settle_seconds=120, clock=clock, retries=0)
    manager = make_manager(tmp_path, source, clock, base)
    manager.debits.delay_tolerance = 0
    assert manager.debits.debit_due() == 1
    prom.stop()
    try:
        for hour in (2, 3, 4):
            clock.now = base + hour * H + timedelta(minutes=5)
            assert manager.debits.debit_due() == 0
            status = manager.debits.accounting_status()
            assert status["status"] == "delayed" and "unavailable" in status["message"]
    finally:
        prom.start()
    assert manager.debits.debit_due() == 3
    assert manager.debits.accounting_status()["status"] == "ok"
    assert balances(manager.ledger) == EXPECTED
    with manager.ledger.db.engine.connect() as conn:
        assert conn.execute(intervals.select()).rowcount != 0
        starts = [r.start for r in conn.execute(intervals.select().where(intervals.c.job == "debit"))]
    assert len(starts) == len(set(starts)) == 4


def test_records_source_charges_allocated_time_exactly(tmp_path):
    """Without Prometheus, debits come from the service's own allocation records."""
    start = datetime(2026, 11, 21, 8, tzinfo=timezone.utc)
    clock = Clock(start + timedelta(minutes=10))
    manager = make_manager(tmp_path, None, clock, start)  # no source: the allocation records
    from gpupool_hub.placement import Request

    manager.ledger.open_account("alice")
    record = manager.admission.admit("alice", [], "", Request(gpus=2), ["RTX A6000"])
    clock.now = start + timedelta(minutes=100)  # held 90 minutes
    manager.admission.release(record.id, "stopped")
    clock.now = start + 3 * H
    assert manager.debits.debit_due() == 3
    debits = [e for e in manager.ledger.history("alice") if e.kind == "debit"]
    assert sum(e.gpu_seconds for e in debits) == 2 * 90 * 60
    assert sum(e.amount for e in debits) == Decimal(-12)  # 2 GPUs × 1.5 h × 4


# ------------------------------------------------------------ kill -9 catch-up


def test_kill_9_in_the_middle_of_a_catch_up_loses_and_doubles_nothing(tmp_path, prometheus_factory):
    # Six hours of history ending two hours ago, charged in one-minute intervals:
    # several hundred intervals to catch up, so a kill lands in the middle.
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    base = now - timedelta(hours=8)
    base = base.replace(minute=0)
    prom = prometheus_factory(usage_table_history(usage_table(base)))
    db = tmp_path / "gpupool.sqlite"
    Ledger(f"sqlite:///{db}").epoch(base)
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(textwrap.dedent(f"""
        c = get_config()  # noqa
        c.GPUPool.prices = {PRICES!r}
        c.GPUPool.nodes = {NODES!r}
        c.GPUPool.db_url = "sqlite:///{db}"
        c.GPUPoolService.debit_interval = 60
        c.GPUPoolService.debit_check_interval = 0.2
        c.GPUPoolService.replenish_interval = 3600
        c.GPUPoolService.reconcile_interval = 3600
        c.GPUPoolService.prometheus_url = "{prom.url}"
        c.GPUPoolService.prometheus_settle = 60
    """))
    env = {**os.environ, "JUPYTERHUB_API_URL": f"http://127.0.0.1:{_free_port()}/hub/api",
           "JUPYTERHUB_API_TOKEN": "x", "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{_free_port()}"}
    ledger = Ledger(f"sqlite:///{db}")

    def charged():
        with ledger.db.engine.connect() as conn:
            return conn.execute(intervals.select().where(intervals.c.job == "debit")).fetchall()

    def run_service():
        return subprocess.Popen([sys.executable, "-m", "gpupool_hub.service", "--config", str(config)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    proc = run_service()
    deadline = time.monotonic() + 60
    while len(charged()) < 60:
        assert time.monotonic() < deadline and proc.poll() is None, "service did not start charging"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = len(charged())
    total_intervals = 6 * 60 + 60  # at least the history plus the quiet hours after it
    assert done_at_kill < total_intervals, "the kill came too late to test anything"

    proc = run_service()
    try:
        deadline = time.monotonic() + 120
        while len(charged()) < total_intervals:
            assert time.monotonic() < deadline and proc.poll() is None, f"stuck at {len(charged())}"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)
    assert balances(ledger) == EXPECTED
    starts = [r.start for r in charged()]
    assert len(starts) == len(set(starts))
    assert ledger.verify().ok
