"""Pool map benchmark (issue 48.10): the admin pool page on the pool of ``scale.py``.

``scale.py --users 100000 --nodes 1000`` times the page among everything else, after
hours of jobs and requests; this times only the page, as a service just started finds
it (restored, nothing computed yet), so that ``paired.py`` can put two revisions side by
side within minutes: 1,000 nodes, 10,000 GPUs, 5,915 running servers, 2,000 waiters.

The pool and ledger are ``scale.py``'s (its ``build``, ``make_pool_manager`` and cache
files, ``build/scale/<seed>-<users>-<nodes>.sqlite``: a ledger either built is used by
the other). Each run works on a copy of it, with the real app (``make_app``) and the
pages' real HubOAuth whose token lookup is answered in-process; one keep-alive client on
loopback asks for ``admin/pool`` after a first render, sequentially. Timed: each
request from the client, median and p95; the first render beside them.

The script is written against the package of whichever tree ``PYTHONPATH`` names (with
its own ``benchmarks/scale.py``), so ``paired.py`` runs this one file against a revision
that had no such benchmark yet; without ``PYTHONPATH``, this checkout's.

    .venv/bin/python benchmarks/poolmap_bench.py [--users 100000 --nodes 1000] [--requests 40]

Target: p95 <= 100 ms (as ``scale.py``'s ``page_pool_p95_ms``). The last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# after PYTHONPATH's tree, never before it: paired.py runs this file against another tree
sys.path.append(str(Path(__file__).resolve().parents[1]))

TARGET_P95_MS = 100.0


def ledger_file(scale: Any, cache_dir: Path, users: int, nodes: int, seed: int, quick: bool) -> tuple[Path, dict]:
    """The tree's built ledger, from ``scale.py``'s cache (the same file names), built by
    the tree's own ``scale.build`` when missing: each revision reads a ledger of its schema."""
    cache = cache_dir / f"{seed}-{users}-{nodes}{'-quick' if quick else ''}.sqlite"
    meta = cache.with_suffix(".json")
    if cache.exists() and meta.exists():
        return cache, json.loads(meta.read_text())
    cache_dir.mkdir(parents=True, exist_ok=True)
    building = cache.with_suffix(".building")
    building.unlink(missing_ok=True)
    built = scale.build(building, users, nodes, seed, quick)
    building.rename(cache)
    meta.write_text(json.dumps(built))
    return cache, built


async def time_page(scale: Any, url: str, nodes: int, requests: int) -> dict[str, float]:
    from tornado.httpserver import HTTPServer

    from gpupool_hub.service.common.context import ServiceContext
    from gpupool_hub.service.heap import keep_start_up_heap
    from gpupool_hub.service.webapp import make_app
    from tests.fixtures.manager import Clock
    from tests.fixtures.ports import free_port
    from tests.pages.inprocess import ADMIN_SCOPE, PREFIX, Browser, StubOAuth, user_model

    clock = Clock(scale.BASE + timedelta(minutes=5))  # scale.py's "now" of the built pool
    manager = scale.make_pool_manager(scale.make_nodes(nodes), url, clock)
    manager.restore()
    keep_start_up_heap()  # as the service does after its start-up
    pages = StubOAuth({"p-admin": user_model(scale.ADMIN, admin=True)})
    context = ServiceContext(manager=manager, hub_auth=None, prefix=PREFIX, admin_scope=ADMIN_SCOPE, page_auth=pages)
    port = free_port()
    server = HTTPServer(make_app(context))
    server.listen(port, "127.0.0.1")
    try:
        browser = Browser(SimpleNamespace(origin=f"http://127.0.0.1:{port}"), "p-admin")  # type: ignore[arg-type]
        t = time.perf_counter()
        r = await browser.get("admin/pool")
        first = (time.perf_counter() - t) * 1000
        assert r.code == 200, (r.code, r.body[:300])
        samples = []
        for _ in range(requests):
            t = time.perf_counter()
            r = await browser.get("admin/pool")
            samples.append((time.perf_counter() - t) * 1000)
        assert r.code == 200, (r.code, r.body[:300])
    finally:
        server.stop()
        manager.close()
        manager.ledger.close()
    return {"pool_page_median_ms": round(statistics.median(samples), 1),
            "pool_page_p95_ms": round(scale.pct(samples, 0.95), 1), "pool_page_first_ms": round(first, 1),
            "pool_page_kb": round(len(r.body) / 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--requests", type=int, default=40, help="timed renders after the first (default 40)")
    ap.add_argument("--cache", help="where built ledgers are kept (default: the tree's build/scale, as scale.py)")
    ap.add_argument("--quick", action="store_true", help="scale.py's lighter heaviest user (tests)")
    args = ap.parse_args()
    if args.users < 20 or args.nodes < 1 or args.requests < 1:
        ap.error("--users must be at least 20, --nodes and --requests at least 1")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("tornado.access").setLevel(logging.CRITICAL)
    from benchmarks import scale  # the tree's (PYTHONPATH), with the package it was written for

    tree = Path(scale.__file__).resolve().parents[1]
    cache, built = ledger_file(scale, Path(args.cache) if args.cache else tree / "build" / "scale", args.users,
                               args.nodes, args.seed, args.quick)
    print(f"{tree}: {built['users']:,} users, {built['nodes']:,} nodes, {built['running']:,} running servers, "
          f"{built['waiting']:,} waiters", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "ledger.sqlite"
        shutil.copyfile(cache, work)
        out = asyncio.run(time_page(scale, f"sqlite:///{work}", args.nodes, args.requests))
    met = out["pool_page_p95_ms"] <= TARGET_P95_MS
    print(f"admin pool page: median {out['pool_page_median_ms']} ms, p95 {out['pool_page_p95_ms']} ms "
          f"(target <= {TARGET_P95_MS:g} ms{'' if met else ', NOT REACHED'}), first render "
          f"{out['pool_page_first_ms']} ms, {out['pool_page_kb']} kB")
    print(json.dumps({**out, "target_p95_ms": TARGET_P95_MS, "target_met": met, "pool": built}))


if __name__ == "__main__":
    main()
