"""benchmarks/scale.py runs end to end on a tiny pool and reports every figure (issue #26).

No timing is asserted here: the figures and their targets live in the benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.scale import TARGETS
from tests.fixtures.processes import communicate_or_kill

REPO = Path(__file__).resolve().parents[1]


def run_bench(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--users", "200", "--nodes", "4", "--quick",
           "--cache", str(tmp_path / "cache"), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    out, err = communicate_or_kill(proc, 300)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_scale_bench_prints_every_figure(tmp_path):
    first = run_bench(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads(first.stdout.strip().splitlines()[-1])
    for db in ("sqlite", "postgresql"):  # both, unless --sqlite-only
        figures = result[db]
        assert set(TARGETS) <= set(figures), (db, sorted(set(TARGETS) - set(figures)))
        assert all(isinstance(figures[name], (int, float)) and figures[name] >= 0 for name in TARGETS), db
    assert result["postgresql"]["restored"] == result["sqlite"]["restored"]
    assert isinstance(result["targets_met"], bool)
    # the built pool is what the options asked for: servers running, others waiting for GPUs
    pool = result["pool"]
    assert (pool["users"], pool["nodes"], pool["gpus"]) == (200, 4, 40)
    assert pool["running"] > 0 and pool["waiting"] > 0 and pool["entries"] >= 200 * 50
    assert result["sqlite"]["restored"] == pool["running"]
    # each figure is printed beside its target, a missed one as NOT REACHED
    for name in TARGETS:
        assert any(line.startswith(name) for line in first.stdout.splitlines()), name
    # the second run takes the cached ledger and leaves it as it was
    cached = sorted((tmp_path / "cache").glob("*.sqlite"))
    assert len(cached) == 1
    before = cached[0].stat().st_mtime_ns
    second = run_bench(tmp_path, "--sqlite-only")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "postgresql" not in json.loads(second.stdout.strip().splitlines()[-1])
    assert "set-up: cached" in second.stderr
    assert cached[0].stat().st_mtime_ns == before
    assert json.loads(second.stdout.strip().splitlines()[-1])["pool"] == pool


def test_the_pool_map_bench_times_the_page_on_the_scale_pool(tmp_path):
    """benchmarks/poolmap_bench.py (issue 48.10; paired.py's ``poolmap``) on a tiny pool past the
    size the map draws cell by cell: it builds scale.py's pool into scale.py's cache file, times
    the admin pool page, and a second run reuses the ledger."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "poolmap_bench.py"), "--users", "200", "--nodes", "40",
           "--quick", "--requests", "3", "--cache", str(tmp_path / "cache")]

    def run() -> dict:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
        out, err = communicate_or_kill(proc, 300)
        assert proc.returncode == 0, err[-3000:]
        assert "admin pool page: median" in out
        return json.loads(out.strip().splitlines()[-1])

    first = run()
    assert first["target_p95_ms"] == TARGETS["page_pool_p95_ms"][0] == 100.0
    assert all(first[k] > 0 for k in ("pool_page_median_ms", "pool_page_p95_ms", "pool_page_first_ms", "pool_page_kb"))
    assert (first["pool"]["users"], first["pool"]["nodes"]) == (200, 40) and first["pool"]["running"] > 0
    cached = tmp_path / "cache" / "26-200-40-quick.sqlite"  # scale.py's name for this pool: either reuses it
    before = cached.stat().st_mtime_ns
    assert run()["pool"] == first["pool"] and cached.stat().st_mtime_ns == before
