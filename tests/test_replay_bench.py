"""benchmarks/replay_openb.py on a tiny trace folder of its own: every workload found by file
name, one without times skipped with the reason, the variants, and every measure of issue 41
in each JSON line and the summary. No figure is asserted: the targets live in the benchmark."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import communicate_or_kill

REPO = Path(__file__).resolve().parents[1]
MEASURES = ("eta_in_range", "eta_median_abs_error", "eta_median_abs_error_long", "eta_median_abs_error_short_s",
            "wait_p95_s", "fifo_fgd_wait_p95_s", "wait_max_s", "fifo_fgd_wait_max_s")


def tiny_trace(folder: Path) -> None:
    """Six nodes of two models, and two pod lists: one with times (busy: more asked than held),
    one without (as the trace's multigpu50)."""
    with open(folder / "openb_node_list_gpu_node.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for i in range(6):
            w.writerow([f"node-{i}", 64000, 262144, 4, "T4" if i % 2 else "V100M32"])
    rng = random.Random(7)
    with open(folder / "openb_pod_list_busy.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                    "creation_time", "deletion_time", "scheduled_time"])
        for i in range(300):
            gpus, milli = rng.choice([(1, 1000), (1, 500), (1, 250), (2, 1000)])
            start = rng.uniform(0, 7200)
            w.writerow([f"pod-{i}", 4000, 16384, gpus, milli, "", "LS", "Running", int(start),
                        int(start + rng.uniform(300, 5400)), int(start)])
    with open(folder / "openb_pod_list_untimed.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])
        w.writerow(["pod-0", 4000, 16384, 1, 1000])


def test_replay_runs_every_workload_of_a_folder_and_its_variants(tmp_path):
    tiny_trace(tmp_path)
    cmd = [sys.executable, str(REPO / "benchmarks" / "replay_openb.py"), "--trace", str(tmp_path), "--workload",
           "all", "--nodes", "0", "--pods", "0", "--load", "1.1", "--derive", "all", "--today"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    out, err = communicate_or_kill(proc, 300)
    assert proc.returncode in (0, 1), err[-3000:]  # 1: some target missed, which this tiny pool may well
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    runs = {x["workload"]: x for x in lines if "eta_in_range" in x and "summary" not in x}
    assert set(runs) == {"busy", "busy+share", "busy+multi", "busy+gpuspec"}
    for name, run in runs.items():
        assert set(MEASURES) <= set(run), (name, sorted(set(MEASURES) - set(run)))
        assert run["wait_max_s"] >= run["wait_p95_s"] >= 0 and run["eta_estimates"] > 0, name
    skipped = [x for x in lines if "skipped" in x and "summary" not in x]
    assert [x["workload"] for x in skipped] == ["untimed"]
    assert "no creation_time or deletion_time column" in skipped[0]["skipped"]
    # the honest past by default: the busy list's first half is the hub's history, the rest is replayed
    assert all(r["past"] == "split 0.5" for r in runs.values())
    assert runs["busy"]["pods"] == 150
    summary = lines[-1]
    assert summary["summary"] and summary["runs"] == 4 and summary["skipped"] == ["untimed"]
    assert summary["targets_reached"] == (proc.returncode == 0) == all(r["targets_reached"] for r in runs.values())
    for measure in ("eta_in_range", "eta_median_abs_error_long", "eta_median_abs_error_short_s"):
        assert summary[measure]["value"] is None or summary[measure]["workload"] in runs


def test_the_past_is_earlier_sessions_never_the_ones_replayed(tmp_path):
    sys.path.insert(0, str(REPO))
    from benchmarks.replay_workloads import load_timed_pods, past_sessions, split_past

    tiny_trace(tmp_path)
    pods = load_timed_pods(tmp_path, "busy")
    earlier, later = split_past(pods, 0.5)
    assert len(earlier) == len(later) == 150
    assert max(p.arrive for p in earlier) <= min(p.arrive for p in later)
    assert not {p.name for p in earlier} & {p.name for p in later}
    # the hub's history holds the earlier sessions under their own users
    assert sorted(u for _, u, _ in past_sessions(earlier)) == sorted(p.user for p in earlier)
    assert split_past(pods, 0.0) == ([], sorted(pods, key=lambda p: (p.arrive, p.name)))
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="below 1"):
            split_past(pods, bad)


def test_a_past_split_out_of_range_is_refused_with_a_clear_error(tmp_path):
    tiny_trace(tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "replay_openb.py"), "--trace", str(tmp_path),
                           "--past-split", "1"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "--past-split must be at least 0 and below 1, not 1" in proc.stderr
