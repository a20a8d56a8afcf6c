"""Wait-queue dispatch cost: 1,000 waiting requests over a full 100-node pool.

Each step releases one held allocation (a random one, seeded) and runs one
dispatch pass over the whole queue in fair order; what it places leaves the
queue and is held from then on. The figure is the time of that pass per
released allocation. Target: median ≤ 5 ms.

    python benchmarks/queue_dispatch.py [--nodes 100] [--waiters 1000] [--releases 300]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool_hub.placement import Pool, Request  # noqa: E402
from gpupool_hub.queue.order import BORROWER, UNDER_QUOTA, Waiter, fair_order  # noqa: E402
from gpupool_hub.queue.dispatch import dispatch  # noqa: E402

TARGET_MS = 5.0
MODELS = ("NVIDIA GeForce RTX 3090", "NVIDIA RTX A6000")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--waiters", type=int, default=1000)
    ap.add_argument("--releases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    nodes = [{"name": f"n{i:03d}", "cpu_milli": 64000, "memory_mib": 262144,
              "gpus": {"count": 8, "model": MODELS[i % 2]}} for i in range(args.nodes)]
    pool = Pool(nodes)
    held = []
    for i in range(args.nodes * 8):  # a full pool: every GPU held by a 1-GPU server
        pool.allocate(f"h{i}", Request(gpus=1))
        held.append(f"h{i}")
    t0 = datetime(2026, 11, 22, tzinfo=timezone.utc)
    shapes = [1] * 6 + [2] * 3 + [4] * 2 + [8]
    queue = [Waiter(f"w{i}", f"u{i}", "", Request(gpus=rng.choice(shapes),
                                                  models=None if rng.random() < 0.5 else frozenset({rng.choice(MODELS)})),
                    t0 + timedelta(seconds=i), UNDER_QUOTA if rng.random() < 0.3 else BORROWER)
             for i in range(args.waiters)]
    ordered = fair_order(queue)
    reservation = None
    times, placed_total = [], 0
    for _ in range(args.releases):
        if not held:
            break
        pool.release(held.pop(rng.randrange(len(held))))
        started = time.perf_counter()
        d = dispatch(pool, ordered, lambda w: w.id, reservation)
        times.append((time.perf_counter() - started) * 1000)
        reservation = d.reservation
        if d.placed:
            gone = {w.id for w, _ in d.placed}
            ordered = [w for w in ordered if w.id not in gone]
            held.extend(gone)
            placed_total += len(gone)
    times.sort()
    median = statistics.median(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"pool: {args.nodes} nodes x 8 GPUs, full; queue: {args.waiters} waiters; {len(times)} releases")
    print(f"dispatch per released allocation: median {median:.3f} ms, p99 {p99:.3f} ms (target: median <= {TARGET_MS} ms)")
    print(f"waiters started: {placed_total}; still waiting: {len(ordered)}")
    print(json.dumps({"dispatch_ms_median": round(median, 3), "dispatch_ms_p99": round(p99, 3),
                      "target_ms_median": TARGET_MS, "waiters": args.waiters, "nodes": args.nodes,
                      "releases": len(times), "started": placed_total, "meets_target": median <= TARGET_MS}))


if __name__ == "__main__":
    main()
