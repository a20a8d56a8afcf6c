"""Within-node GPU picks on 16-GPU nodes: latency of choosing k well-connected GPUs.

A pick is ``Topology.choose(free, k)``: the k GPUs among the free ones that
are best connected *and* leave the rest partitionable into well-connected
sets of the same size (docs/placement.md). Enumerating subsets is fine up to
8 GPUs; a 16-GPU node has 12,870 subsets of 8, so the engine must search
smarter. This benchmark times picks of 2 to 8 GPUs from random free sets
on two real 16-GPU topologies, uncached (the per-node pick cache is cleared
before every call), and prints the p99 against the target (1 ms). The last
line of output is one JSON object.

    python benchmarks/placement_pick.py                  # 400 random free sets per size and topology
    python benchmarks/placement_pick.py --trials 100 --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool_hub.placement import Node, load_node  # noqa: E402

TARGET_P99_MS = 1.0
SIZES = (2, 3, 4, 5, 6, 7, 8)  # the brief names 2, 4 and 8; the rest cost the same or less

# DGX-1V hybrid cube-mesh: NVLink counts per pair (quads 0-3 and 4-7 fully
# connected, plus 0-4, 1-5, 2-6, 3-7), as `nvidia-smi topo -m` shows them.
CUBE_MESH = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
    (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}


def _pcie(a: int, b: int) -> str:
    """PCIe relation on a dual-socket 16-GPU chassis: pairs share a switch, quads a
    switch tree, 8 GPUs a socket; the two halves meet across the SMP link."""
    if a // 2 == b // 2:
        return "SINGLE"
    if a // 4 == b // 4:
        return "MULTIPLE"
    if a // 8 == b // 8:
        return "NODE"
    return "SYSTEM"


def dgx2_like(name: str = "dgx2") -> Node:
    """16 GPUs on NVSwitch: six NVLinks between every pair; PCIe decides the rest."""
    links = [{"gpus": [a, b], "nvlinks": 6, "pcie": _pcie(a, b)} for a in range(16) for b in range(a + 1, 16)]
    return load_node({"name": name, "cpu_milli": 96000, "memory_mib": 1536 * 1024,
                      "gpus": {"count": 16, "model": "Tesla V100-SXM3-32GB"}, "links": links})


def two_cube_meshes(name: str = "hgx2x8") -> Node:
    """Two 8-GPU hybrid cube-mesh boards (DGX-1V style) joined only by PCIe."""
    links = []
    for a in range(16):
        for b in range(a + 1, 16):
            nv = CUBE_MESH.get((a % 8, b % 8), 0) if a // 8 == b // 8 else 0
            links.append({"gpus": [a, b], "nvlinks": nv, "pcie": _pcie(a, b)})
    return load_node({"name": name, "cpu_milli": 96000, "memory_mib": 1536 * 1024,
                      "gpus": {"count": 16, "model": "Tesla V100-SXM2-32GB"}, "links": links})


TOPOLOGIES = {"dgx2-like": dgx2_like, "2x-cube-mesh": two_cube_meshes}


def free_sets(rng: random.Random, n: int, k: int, trials: int) -> List[Tuple[int, ...]]:
    """Random free sets with at least k GPUs: from a whole free node down to exactly k free."""
    out = []
    for _ in range(trials):
        size = rng.randint(k, n)
        out.append(tuple(sorted(rng.sample(range(n), size))))
    return out


def time_picks(node: Node, k: int, sets: Sequence[Tuple[int, ...]]) -> List[float]:
    topo = node.topology
    clock = time.perf_counter_ns
    out = []
    for free in sets:
        topo._cache.clear()  # uncached: every pick searches
        t0 = clock()
        chosen = topo.choose(free, k)
        out.append((clock() - t0) / 1e6)
        assert len(chosen) == k and set(chosen) <= set(free), (free, k, chosen)
    return out


def p99(values: Sequence[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=400, help="random free sets per size and topology")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    ok = True
    print(f"uncached picks on 16-GPU nodes, {args.trials} random free sets per size; target p99 ≤ {TARGET_P99_MS} ms")
    print(f"{'topology':<14} {'GPUs':>4} {'mean ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for tname, build in TOPOLOGIES.items():
        node = build()
        rng = random.Random(args.seed)
        results[tname] = {}
        for k in SIZES:
            lat = time_picks(node, k, free_sets(rng, len(node.gpus), k, args.trials))
            r = {"mean_ms": round(statistics.fmean(lat), 3), "p99_ms": round(p99(lat), 3),
                 "max_ms": round(max(lat), 3)}
            results[tname][str(k)] = r
            good = r["p99_ms"] <= TARGET_P99_MS
            ok &= good
            print(f"{tname:<14} {k:>4} {r['mean_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms']:>8.3f}"
                  f"  {'PASS' if good else 'FAIL'}")
    worst = max(r["p99_ms"] for per in results.values() for r in per.values())
    print(f"worst p99 {worst:.3f} ms, target {TARGET_P99_MS} ms: {'PASS' if ok else 'FAIL'}")
    print(json.dumps({"target_p99_ms": TARGET_P99_MS, "worst_p99_ms": worst, "topologies": results}, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
