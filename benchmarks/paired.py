"""Paired benchmark: two revisions of the project, run alternately on one machine.

A change that must not make the service slower (a refactor, a new layer) is
judged against the revision before it, not against a figure measured another
day: the machine is shared, so its speed drifts by more than the change could
cost. This script checks out ``--old`` and ``--new`` as temporary worktrees
(``git worktree add`` under /tmp, removed at the end), then runs each
benchmark several rounds, alternating which tree goes first (old-new, new-old,
…), each tree's own ``benchmarks/*.py`` with ``PYTHONPATH`` on that tree.

Per figure it reports both trees' medians and the median of the per-round
ratios new/old (for a rate, old/new), so 1.10 always means "new is 10 %
slower". Target: every ratio <= 1.05.

    .venv/bin/python benchmarks/paired.py --old 7c93812 --new HEAD [--rounds 2]

Quick sizes (each benchmark's own options) keep the run within ~15 minutes on
two cores; ``--bench`` picks some of service, spawn, pages, poolmap. ``poolmap``
(the admin pool page on ``scale.py``'s pool of 100k users and 1,000 nodes) first
builds that pool's ledger once in each tree (2-3 minutes each). A benchmark added
with the change it measures (``poolmap``), where the old tree lacks it, is the new tree's script, run against
each tree's package. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TARGET_RATIO = 1.05
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bench:
    script: str
    args: tuple[str, ...]
    #: figure -> True when larger is better (a rate), False for a time
    figures: dict[str, bool]
    #: the new tree's script for both trees, each run with its own package (PYTHONPATH): a
    #: benchmark written with the change it measures, which the old tree does not have
    new_script: bool = False


BENCHES = {
    "service": Bench("benchmarks/service_bench.py", ("--runs", "1", "--requests", "1000"),
                     {"debit_cycle_10k_s": False, "me_p99_ms": False, "me_rps": True}),
    "spawn": Bench("benchmarks/spawn_bench.py", ("--rounds", "40"),
                   {"gpupool_start_ms_median": False, "spawn_overhead_ms_median": False}),
    "pages": Bench("benchmarks/pages_bench.py", ("--requests", "15", "--others", "2"),
                   {"server_median_ms_30d": False, "server_median_ms_90d": False, "server_p95_ms_90d": False}),
    "poolmap": Bench("benchmarks/poolmap_bench.py", ("--requests", "40"),
                     {"pool_page_median_ms": False, "pool_page_p95_ms": False}, new_script=True),
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def add_worktree(rev: str, where: Path) -> str:
    """Check ``rev`` out at ``where`` (detached); its full commit id."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    git("worktree", "add", "--detach", str(where), commit)
    return commit


def script_tree(trees: dict[str, Path], side: str, bench: Bench) -> Path | None:
    """Where ``side``'s script comes from: its own tree, or the new tree's for a benchmark added with the
    change it measures that the old tree lacks (a later change runs each tree's own: its imports follow
    its package)."""
    if bench.new_script and not (trees[side] / bench.script).exists():
        return trees["new"]
    return None


def run_once(tree: Path, bench: Bench, timeout: float, tries: int = 2, script_tree: Path | None = None
             ) -> dict[str, float]:
    """One run of ``bench`` in ``tree`` (its script from ``script_tree``, by default the same
    tree): the JSON object of its last line. A failed run (on a loaded machine a client may
    time out) is tried once more, then reported."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    script = str((script_tree or tree) / bench.script)
    for attempt in range(1, tries + 1):
        proc = subprocess.run([sys.executable, script, *bench.args], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=timeout)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            return json.loads(lines[-1])
        print(f"{bench.script} in {tree} failed (exit {proc.returncode}, try {attempt} of {tries}):\n"
              f"{proc.stderr[-1500:]}", file=sys.stderr)
    raise RuntimeError(f"{bench.script} in {tree} failed {tries} times")


def slowdown(old: float, new: float, larger_is_better: bool) -> float:
    """new/old for a time, old/new for a rate: above 1 means new is slower."""
    num, den = (old, new) if larger_is_better else (new, old)
    return num / den if den else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the revision before the change (a commit, branch or tag)")
    ap.add_argument("--new", default="HEAD", help="the revision with the change (default HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each benchmark per tree (default 2: old-new, new-old)")
    ap.add_argument("--bench", default=",".join(BENCHES), help=f"comma-separated, of {', '.join(BENCHES)}")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one benchmark run may take")
    args = ap.parse_args()
    names = [n.strip() for n in args.bench.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown or args.rounds < 1:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}" if unknown else "--rounds must be >= 1")

    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-paired-"))
    trees: dict[str, Path] = {}
    commits: dict[str, str] = {}
    result: dict[str, object] = {"target_ratio": TARGET_RATIO, "rounds": args.rounds}
    try:
        for side, rev in (("old", args.old), ("new", args.new)):
            trees[side] = tmp / side
            commits[side] = add_worktree(rev, trees[side])
        result.update(old=commits["old"][:12], new=commits["new"][:12])
        print(f"old {commits['old'][:12]} ({args.old}), new {commits['new'][:12]} ({args.new}); "
              f"{args.rounds} rounds each, alternating", file=sys.stderr)
        runs: dict[str, dict[str, list[dict[str, float]]]] = {n: {"old": [], "new": []} for n in names}
        for i in range(args.rounds):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for name in names:
                for side in order:
                    t0 = time.perf_counter()
                    bench = BENCHES[name]
                    runs[name][side].append(run_once(trees[side], bench, args.timeout,
                                                     script_tree=script_tree(trees, side, bench)))
                    print(f"round {i + 1}: {name} {side} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        figures: dict[str, dict[str, float]] = {}
        print(f"{'figure':<34} {'old median':>11} {'new median':>11} {'new/old':>8} {'target':>8}")
        for name in names:
            for fig, larger_is_better in BENCHES[name].figures.items():
                old = [r[fig] for r in runs[name]["old"]]
                new = [r[fig] for r in runs[name]["new"]]
                ratio = statistics.median(slowdown(o, n, larger_is_better) for o, n in zip(old, new))
                key = f"{name}.{fig}"
                figures[key] = {"old": round(statistics.median(old), 3), "new": round(statistics.median(new), 3),
                                "ratio": round(ratio, 3)}
                print(f"{key:<34} {figures[key]['old']:>11} {figures[key]['new']:>11} {ratio:>8.3f} "
                      f"{f'<= {TARGET_RATIO}':>8}{'' if ratio <= TARGET_RATIO else '  SLOWER'}")
        result["figures"] = figures
        result["ok"] = all(f["ratio"] <= TARGET_RATIO for f in figures.values())
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
