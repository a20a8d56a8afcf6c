"""Service benchmark: a debit cycle from a real Prometheus, and GET me under load.

Targets (issue #4, tightened by issue #26 to "the old targets with room"):
- one debit cycle for 10,000 users holding 2,000 GPUs (0.2 GPU each, two
  models), reading usage from a real Prometheus: <= 1 s (was 2 s; median of 5
  runs, each on a fresh ledger of 10,000 accounts);
- GET me from 50 clients on loopback (one keep-alive connection each) against
  the service run by a real JupyterHub (tokens checked by the hub, then
  cached), asking 500 times a second in all, three times what 5,000 open labs'
  widgets ask, each latency counted from when its request was due:
  ``me_paced_p99_ms`` <= 10 ms (was 20 ms for the closed loop below).
- the same clients as a closed loop (each sends its next request as soon as the
  last answer arrives): ``me_p99_ms`` and ``me_rps``, the capacity, printed
  without a target. Its p99 is about 50 / requests per second, and a bare
  tornado handler with the same clients is already above 10 ms here (see
  docs/performance.md).

Needs `prometheus`, `promtool` and configurable-http-proxy (scripts/setup-env.sh).
The last line printed is one JSON object.

    .venv/bin/python benchmarks/service_bench.py [--requests 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from traitlets.config import Config  # noqa: E402

from gpupool_hub.config import GPUPool, make_pool  # noqa: E402
from gpupool_hub.ledger import Ledger  # noqa: E402
from gpupool_hub.ledger.schema import accounts  # noqa: E402
from gpupool_hub.service.core.manager import PoolManager  # noqa: E402
from gpupool_hub.usage.prometheus import PrometheusUsageSource  # noqa: E402

USERS = 10_000
MODELS = ("NVIDIA GeForce RTX 3090", "NVIDIA RTX A6000")
PRICES = {"RTX 3090": 1, "RTX A6000": 4}


def p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def history_text(base_ts: int) -> str:
    lines = ["# TYPE gpupool_allocated_gpus gauge"]
    for i in range(USERS):
        labels = f'allocation="a{i}",model="{MODELS[i % 2]}",node="n{i % 250}",server="",user="user{i:05d}"'
        for t in range(base_ts, base_ts + 3600, 60):
            lines.append(f"gpupool_allocated_gpus{{{labels}}} 0.2 {t}")
        lines.append(f"gpupool_allocated_gpus{{{labels}}} 0 {base_ts + 3600}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def bench_debit(tmp: Path, runs: int) -> float:
    from tests.fixtures.prometheus import PrometheusServer, _backfill, _binaries, _free_port, history_base

    prometheus, promtool = _binaries()
    base = history_base(2)
    t0 = time.perf_counter()
    (tmp / "prom").mkdir()
    server = PrometheusServer(prometheus, tmp / "prom", _free_port())
    _backfill(promtool, history_text(int(base.timestamp())), tmp / "prom", server.data_dir)
    server.start()
    print(f"setup: Prometheus with {USERS:,} series x 60 samples in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    c = Config()
    c.GPUPool.prices = PRICES
    settings = GPUPool(config=c)
    times = []
    try:
        for run in range(runs):
            ledger = Ledger(f"sqlite:///{tmp}/ledger{run}.sqlite")
            with ledger.db.engine.begin() as conn:
                conn.execute(accounts.insert(), [
                    dict(name=f"user{i:05d}", balance_milli=100_000, created_at=base.replace(tzinfo=None),
                         credits_through=None) for i in range(USERS)])
            ledger.epoch(base)
            clock = lambda: base + timedelta(hours=1, minutes=5)  # noqa: E731
            source = PrometheusUsageSource(server.url, "gpupool", settle_seconds=120, clock=clock, timeout=60)
            manager = PoolManager(settings=settings, ledger=ledger, pool=make_pool(settings),
                                  usage_source=source, clock=clock)
            t = time.perf_counter()
            charged = manager.debits.debit_due()
            times.append(time.perf_counter() - t)
            assert charged == 1
            total = sum(a.balance for a in ledger.accounts(limit=USERS))
            expected = USERS * Decimal(100) - Decimal(USERS // 2) * (Decimal("0.2") + Decimal("0.8"))
            assert total == expected, (total, expected)
            ledger.close()
    finally:
        server.stop()
    return statistics.median(times)


#: the paced load, requests per second (scale.py's ME_RATE)
ME_RATE = 500.0


async def bench_me(tmp: Path, n_requests: int, concurrency: int) -> tuple[float, float, float]:
    """(closed-loop p99, its requests per second, paced p99), on one hub."""
    from tests.fixtures.hub import Hub, find_chp

    if find_chp() is None:
        raise SystemExit("configurable-http-proxy is missing: run scripts/setup-env.sh")
    hub = Hub(tmp / "hub")
    (tmp / "hub").mkdir()
    hub.start()
    try:
        tokens = []
        for i in range(concurrency):
            hub.create_user(f"client{i}")
            tokens.append(hub.token_for(f"client{i}"))
        path = "/services/gpupool/api/v1/me"
        latencies: list[float] = []
        remaining = n_requests
        rate, start = 0.0, 0.0

        async def worker(k: int, token: str) -> None:
            # One keep-alive connection per client, as load generators (wrk, hey) use.
            nonlocal remaining
            reader, writer = await asyncio.open_connection("127.0.0.1", hub.service_port)
            request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       f"Authorization: token {token}\r\n\r\n").encode()

            async def fetch() -> None:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                assert status == 200 and body.startswith(b"{"), (status, body[:200])

            await fetch()  # warm: account opened, token checked once by the hub
            warmed.append(token)
            await ready.wait()
            i = 0
            while remaining > 0:
                remaining -= 1
                if rate:  # paced: this client's i-th request is due at its slot; lateness counts
                    t = start + (k + len(tokens) * i) / rate
                    i += 1
                    if t > time.perf_counter():
                        await asyncio.sleep(t - time.perf_counter())
                else:
                    t = time.perf_counter()
                await fetch()
                latencies.append((time.perf_counter() - t) * 1000)
            writer.close()

        out = []
        for rate in (0.0, ME_RATE):
            latencies.clear()
            remaining = n_requests
            ready, warmed = asyncio.Event(), []
            tasks = [asyncio.ensure_future(worker(k, t)) for k, t in enumerate(tokens)]
            while len(warmed) < len(tokens):
                await asyncio.sleep(0.05)
            start = time.perf_counter() + 0.05
            ready.set()
            await asyncio.gather(*tasks)
            out += [p99(latencies), len(latencies) / (time.perf_counter() - start)]
        return out[0], out[1], out[2]
    finally:
        hub.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        debit_s = bench_debit(Path(tmp), args.runs)
        me_p99, me_rps, paced_p99 = asyncio.run(bench_me(Path(tmp), args.requests, args.concurrency))
    result = {"debit_cycle_10k_s": round(debit_s, 3), "me_paced_p99_ms": round(paced_p99, 2),
              "me_p99_ms": round(me_p99, 2), "me_rps": round(me_rps, 1)}
    targets = {"debit_cycle_10k_s": 1.0, "me_paced_p99_ms": 10.0}
    result["targets_met"] = all(result[k] <= v for k, v in targets.items())
    print(f"{'figure':<20} {'measured':>10} {'target':>10}")
    for name, target in targets.items():
        verdict = "reached" if result[name] <= target else "NOT REACHED"
        note = f"  ({args.concurrency} clients, {ME_RATE:g} requests/s in all)" if name == "me_paced_p99_ms" else ""
        print(f"{name:<20} {result[name]:>10} {'<= ' + format(target, 'g'):>10}  {verdict}{note}")
    print(f"{'me_p99_ms':<20} {result['me_p99_ms']:>10} {'-':>10}  (closed loop: the capacity)")
    print(f"{'me_rps':<20} {result['me_rps']:>10} {'-':>10}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
