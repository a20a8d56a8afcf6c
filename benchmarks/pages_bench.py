"""Pages benchmark: "My GPU usage" for a user with 10,000 ledger entries.

Target (issue #15): the page loads in <= 300 ms on the server (p95 of the
90-day view, the larger of the two, measured as tornado's request time of the
page handler, i.e. from the request's arrival to the last byte written).

Set-up: a file SQLite ledger (or ``--db``) holding one user ("alice") with
10,000 entries over the last 90 days (hourly debits on three GPU models, daily
credits, a few grants) among ``--others`` users with 2,000 entries each; the
real service app (``make_app``) with the pages' real HubOAuth code, whose token
lookup is answered in-process (no hub round trip is timed); one keep-alive
client on loopback, sequential requests after a warm-up.

    .venv/bin/python benchmarks/pages_bench.py [--requests 40] [--db postgresql://...]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpupool_hub.ledger import Posting  # noqa: E402
from tests.fixtures.manager import make_manager  # noqa: E402
from tests.pages.inprocess import PagesService, user_model  # noqa: E402

TARGET_MS = 300
ENTRIES = 10_000
DAYS = 90
MODELS = (("NVIDIA GeForce RTX 3090", Decimal(1)), ("NVIDIA RTX A6000", Decimal(4)),
          ("NVIDIA GeForce RTX 2080", Decimal("0.5")))
NODES = [{"name": "n1", "cpu_milli": 64000, "memory_mib": 262144,
          "gpus": {"count": 4, "model": "NVIDIA GeForce RTX 3090"}}]


def postings(user: str, count: int, now: datetime) -> list[tuple[datetime, Posting]]:
    """``count`` entries of ``user`` spread evenly over the last ``DAYS`` days."""
    out = []
    start = now - timedelta(days=DAYS) + timedelta(minutes=5)
    step = (now - start) / count
    for i in range(count):
        at = start + step * i
        if i % 100 == 0:
            out.append((at, Posting(user, "daily" if i % 300 else "grant", Decimal(5), f"{user}:c{i}",
                                    reason="credit")))
            continue
        model, price = MODELS[i % len(MODELS)]
        t0 = at - timedelta(hours=1)
        out.append((at, Posting(user, "debit", -price * Decimal("0.25"), f"{user}:d{i}", reason="usage",
                                model=model, interval_start=t0, interval_end=at, gpu_seconds=Decimal(900))))
    return out


def fill(manager, others: int) -> int:
    now = manager.clock()
    batch = postings("alice", ENTRIES, now)
    for j in range(others):
        batch += postings(f"user{j:03d}", 2000, now)
    # like the debit job: one transaction per hour holding every user's entries of that hour
    hours: dict[datetime, list[Posting]] = {}
    for at, posting in sorted(batch, key=lambda p: p[0]):
        hours.setdefault(at.replace(minute=0, second=0, microsecond=0), []).append(posting)
    for hour, group in hours.items():
        manager.ledger.post_many(group, now=hour + timedelta(minutes=59))
    return len(batch)


async def measure(db: str, requests: int, others: int) -> dict[str, float]:
    manager = make_manager(NODES, {"RTX 3090": 1, "RTX A6000": 4, "RTX 2080": 0.5}, db,
                           clock=lambda: datetime.now(timezone.utc))
    t = time.perf_counter()
    total = fill(manager, others)
    filled_s = time.perf_counter() - t
    alice_entries = sum(1 for _ in manager.ledger.history("alice", limit=ENTRIES + 10))
    server_ms: dict[str, list[float]] = {}

    def log(handler) -> None:
        server_ms.setdefault(handler.request.uri, []).append(1000 * handler.request.request_time())

    service = PagesService(manager, {"alice-token": user_model("alice")})
    service.app.settings["log_function"] = log
    browser = service.client("alice-token")
    try:
        for path in ("?days=30", "?days=90"):
            for _ in range(3):  # warm-up: the me view cache, SQLite's page cache, Jinja's compiled templates
                r = await browser.get(path)
                assert r.code == 200, r.body[:500]
            server_ms.pop(f"/services/gpupool/{path}", None)
            client_ms = []
            for _ in range(requests):
                t0 = time.perf_counter()
                r = await browser.get(path)
                client_ms.append(1000 * (time.perf_counter() - t0))
                assert r.code == 200
            server_ms[f"client{path}"] = client_ms
        points_90 = r.body.decode().count('class="point"')
        assert points_90 == DAYS, points_90
    finally:
        service.stop()
    result = {"entries_alice": alice_entries, "entries_total": total, "fill_s": round(filled_s, 1)}
    for days in (30, 90):
        samples = sorted(server_ms[f"/services/gpupool/?days={days}"])
        result[f"server_median_ms_{days}d"] = round(statistics.median(samples), 1)
        result[f"server_p95_ms_{days}d"] = round(samples[min(len(samples) - 1, int(0.95 * len(samples)))], 1)
        result[f"client_median_ms_{days}d"] = round(statistics.median(server_ms[f"client?days={days}"]), 1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40, help="measured loads per view (after 3 warm-up loads)")
    ap.add_argument("--others", type=int, default=20, help="other users with 2,000 entries each")
    ap.add_argument("--db", default="", help="ledger URL (default: a SQLite file in a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{tmp}/ledger.sqlite"
        result = asyncio.run(measure(db, args.requests, args.others))
    result["target_ms"] = TARGET_MS
    result["ok"] = result["server_p95_ms_90d"] <= TARGET_MS
    print(f"My GPU usage, alice with {result['entries_alice']:,} entries "
          f"({result['entries_total']:,} in the ledger), {args.requests} loads per view")
    print(f"{'figure':<26} {'measured':>10} {'target':>10}")
    for days in (30, 90):
        print(f"{f'server_median_ms_{days}d':<26} {result[f'server_median_ms_{days}d']:>10}")
        print(f"{f'server_p95_ms_{days}d':<26} {result[f'server_p95_ms_{days}d']:>10} {f'<= {TARGET_MS}':>10}")
        print(f"{f'client_median_ms_{days}d':<26} {result[f'client_median_ms_{days}d']:>10}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
