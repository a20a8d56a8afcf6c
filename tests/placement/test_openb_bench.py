"""The openb benchmark finds its trace without a path baked in, and says how to set it when it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import placement_openb as bench

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i},32000,131072,{g},{m}\n" for i, (g, m) in enumerate([(8, "G2"), (8, "G2"), (2, "T4"), (4, "V100M16")]))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    f"p{i},{c},{mem},{n},{milli},\n" for i, (c, mem, n, milli) in enumerate(
        [(4000, 8192, 1, 1000), (2000, 4096, 1, 470), (8000, 16384, 8, 1000), (1000, 2048, 0, 0),
         (2000, 4096, 1, 810), (4000, 8192, 2, 1000), (2000, 4096, 1, 230)]))


def fake_trace(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / bench.TRACE_MARKER).write_text(NODES)
    for wl in bench.WORKLOADS:
        (root / f"openb_pod_list_{wl}.csv").write_text(PODS)
    return root


def test_explicit_path_wins_and_is_never_replaced(tmp_path):
    good = fake_trace(tmp_path / "t")
    assert bench.resolve_trace(str(good), env={}, candidates=()) == good
    assert bench.resolve_trace(None, env={bench.TRACE_ENV: str(good)}, candidates=()) == good
    with pytest.raises(bench.TraceNotFound, match=r"nowhere.*--trace.*GPUPOOL_OPENB_TRACE"):
        bench.resolve_trace(str(tmp_path / "nowhere"), env={bench.TRACE_ENV: str(good)}, candidates=(good,))


def test_default_is_the_first_candidate_that_exists(tmp_path):
    inside, beside = tmp_path / "repo/shared/traces/openb", fake_trace(tmp_path / "shared/traces/openb")
    assert bench.resolve_trace(None, env={}, candidates=(inside, beside)) == beside
    with pytest.raises(bench.TraceNotFound) as info:
        bench.resolve_trace(None, env={}, candidates=(inside,))
    assert str(inside) in str(info.value) and bench.TRACE_ENV in str(info.value)


def test_defaults_look_inside_and_next_to_the_repository():
    repo = Path(bench.__file__).resolve().parents[1]
    assert bench.TRACE_CANDIDATES == (repo / "shared/traces/openb", repo.parent / "shared/traces/openb")


def test_missing_trace_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(bench.TRACE_ENV, raising=False)
    assert bench.main(["--trace", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "none") in err and "--trace" in err and bench.TRACE_ENV in err


def test_json_line_has_fgd_for_every_workload(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(bench.TRACE_ENV, str(fake_trace(tmp_path / "t")))
    bench.main(["--seeds", "42", "--policies", "fgd", "--quiet"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for wl in ("default", "multigpu50", "gpushare40"):
        assert set(summary[wl]["fgd"]) >= {"unallocated_130", "alloc_100", "mean_us", "p99_us"}
