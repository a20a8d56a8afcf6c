"""Ledger benchmark: a 10,000-user debit batch, balance reads, history pages.

Targets (issue #2): the 10k-user batch <= 1 s on SQLite, a balance read
<= 1 ms p99, a 50-row history page <= 10 ms p99 in a ledger of 1,000,000
entries. Each figure is the median of 5 runs. The last line printed is one
JSON object.

    .venv/bin/python benchmarks/ledger_bench.py [--db URL] [--entries N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool_hub.money.keys import entry_key  # noqa: E402
from gpupool_hub.ledger import Ledger, Posting  # noqa: E402
from gpupool_hub.ledger.schema import accounts, entries  # noqa: E402

USERS = 10_000
RUNS = 5
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def p99(samples: list[float]) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(round(0.99 * (len(samples) - 1))))]


def fill(ledger: Ledger, users: list[str], total: int) -> None:
    """Bulk-load ``total`` historic debit entries spread over ``users`` (setup, not measured)."""
    per_user = max(1, total // len(users))
    created = START.replace(tzinfo=None)
    with ledger.db.engine.begin() as conn:
        conn.execute(
            accounts.insert(),
            [dict(name=u, balance_milli=-500 * per_user, created_at=created, credits_through=None) for u in users],
        )
        batch = []
        # interleave users hour by hour, as a real ledger grows
        for hour in range(per_user):
            t = created + timedelta(hours=hour)
            for u in users:
                batch.append(dict(account=u, kind="debit", amount_milli=-500, reason="", actor="system",
                                  idempotency_key=f"fill:{u}:{hour}", created_at=t, interval_start=t,
                                  interval_end=t + timedelta(hours=1), model="NVIDIA GeForce RTX 2080",
                                  gpu_seconds=Decimal(3600)))
            if len(batch) >= 50_000:
                conn.execute(entries.insert(), batch)
                batch.clear()
        if batch:
            conn.execute(entries.insert(), batch)


def bench(url: str, n_entries: int) -> dict[str, object]:
    ledger = Ledger(url)
    users = [f"user{i:05d}" for i in range(USERS)]
    t0 = time.perf_counter()
    fill(ledger, users, n_entries)
    print(f"setup: {n_entries:,} entries for {USERS:,} users in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    batch_s = []
    for run in range(RUNS):
        interval = START + timedelta(days=400, hours=run)
        postings = [
            Posting(u, "debit", Decimal("-0.5"), entry_key("debit", u, "NVIDIA GeForce RTX 2080", interval),
                    interval_start=interval, interval_end=interval + timedelta(hours=1),
                    model="NVIDIA GeForce RTX 2080", gpu_seconds=Decimal(3600))
            for u in users
        ]
        t = time.perf_counter()
        ledger.post_many(postings, complete_interval=("debit", interval, interval + timedelta(hours=1)))
        batch_s.append(time.perf_counter() - t)

    rng = random.Random(42)
    balance_p99, history_p99 = [], []
    for _ in range(RUNS):
        samples = []
        for u in rng.choices(users, k=2000):
            t = time.perf_counter()
            ledger.balance(u)
            samples.append((time.perf_counter() - t) * 1000)
        balance_p99.append(p99(samples))
        samples = []
        for u in rng.choices(users, k=500):
            t = time.perf_counter()
            page = ledger.history(u, limit=50)
            samples.append((time.perf_counter() - t) * 1000)
        assert len(page) == 50
        history_p99.append(p99(samples))
    report = ledger.verify()
    assert report.ok, report.mismatches[:3]
    db = ledger.db.engine.dialect.name
    ledger.close()
    return {
        "debit_batch_10k_s": round(statistics.median(batch_s), 4),
        "balance_read_p99_ms": round(statistics.median(balance_p99), 4),
        "history_page_p99_ms": round(statistics.median(history_p99), 4),
        "db": db,
        "entries": report.entries,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="SQLAlchemy URL of an EMPTY database (default: a temporary SQLite file)")
    ap.add_argument("--entries", type=int, default=1_000_000, help="ledger size for the history reads")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{tmp}/bench.sqlite"
        result = bench(url, args.entries)
    targets = {"debit_batch_10k_s": 1.0, "balance_read_p99_ms": 1.0, "history_page_p99_ms": 10.0}
    print(f"{'figure':<22} {'median of 5':>12} {'target':>8}  ok")
    for key, target in targets.items():
        value = result[key]
        print(f"{key:<22} {value:>12} {'<= ' + str(target):>8}  {'yes' if value <= target else 'NO'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
