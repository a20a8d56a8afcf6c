"""Table tests of the Slurm inventory parsers on outputs captured from a real cluster.

The files in ``data/`` come from ``tests/slurm/capture_outputs.py`` (Slurm
22.05, the test cluster of tests/fixtures/slurm.py: gpu-a 4 x a6000, gpu-b
2 x rtx3090, gpu-c 1 x a6000 + 1 x rtx3090). The expected values below were
read off those files by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool_hub.engines.slurm import (SlurmCommandError, SlurmError, SlurmInventory, SlurmOutputError,
    UnmappedGresType, expand_hostlist, parse_gres, parse_index_list, parse_job, parse_node_state, parse_nodes,
    parse_record, parse_squeue, run_slurm)
from gpupool_hub.placement import Pool, load_node, load_nodes

DATA = Path(__file__).resolve().parent / "data"
MODELS = {"a6000": "NVIDIA RTX A6000", "rtx3090": "NVIDIA GeForce RTX 3090"}
A6000, RTX3090 = MODELS["a6000"], MODELS["rtx3090"]


def data(name: str) -> str:
    return (DATA / name).read_text()


def nodes(name: str) -> dict:
    return {n.name: n for n in parse_nodes(data(name), MODELS)}


# ---------------------------------------------------------------------------
# nodes
# ---------------------------------------------------------------------------


def test_idle_nodes_become_pool_nodes() -> None:
    got = nodes("nodes_idle.txt")
    assert list(got) == ["gpu-a", "gpu-b", "gpu-c"]
    a, b, c = got["gpu-a"], got["gpu-b"], got["gpu-c"]
    assert a.config() == {
        "name": "gpu-a",
        "cpu_milli": 8000,
        "memory_mib": 16000,
        "gpus": [{"index": i, "uuid": f"gpu-a/gpu{i}", "model": A6000} for i in range(4)],
        "labels": {"slurm.partitions": "gpu,big", "slurm.partition.gpu": "true", "slurm.partition.big": "true",
                   "slurm.feature.ampere": "true", "slurm.feature.nvlink": "true"},
    }
    assert [(g.index, g.gres_type, g.model) for g in b.gpus] == [(0, "rtx3090", RTX3090), (1, "rtx3090", RTX3090)]
    assert b.cpus == 4 and b.memory_mib == 8000 and b.partitions == ("gpu",) and b.features == ()
    # mixed node: Slurm numbers GPUs by type in the order of Gres=
    assert [(g.index, g.gres_type) for g in c.gpus] == [(0, "a6000"), (1, "rtx3090")]
    for n in got.values():
        assert n.takes_placements and n.why_not is None and n.gpus_in_use == frozenset()
        assert n.state.raw == "IDLE"
    # the configs are valid c.GPUPool.nodes entries and make a pool
    pool = Pool(load_nodes([n.config() for n in got.values()]))
    assert pool is not None
    assert load_node(c.config()).gpus[1].model == RTX3090


def test_gpus_in_use_per_node_and_type() -> None:
    got = nodes("nodes_busy.txt")
    assert got["gpu-a"].gpus_in_use == {0, 1, 2, 3} and got["gpu-a"].free_gpus == ()
    assert got["gpu-b"].gpus_in_use == {0} and got["gpu-b"].free_gpus == (1,)
    assert got["gpu-c"].gpus_in_use == {0, 1}
    assert got["gpu-c"].used_by_type() == {"a6000": 1, "rtx3090": 1}
    assert got["gpu-b"].used_by_type() == {"rtx3090": 1}
    assert all(n.state.raw == "MIXED" and n.takes_placements for n in got.values())


def test_drained_draining_and_reserved_nodes_take_no_placements() -> None:
    got = nodes("nodes_drain_resv.txt")
    a, b, c = got["gpu-a"], got["gpu-b"], got["gpu-c"]
    assert a.state.raw == "IDLE+DRAIN" and not a.takes_placements
    # the reason keeps its "x=1": inside Reason= only a known key ends the value
    # what users read: the admin's words, not slurmctld's "[root@<time>]" (issue 48.9)
    assert a.reason == "fan broken x=1 (ticket 42)"
    assert a.why_not == "drained: fan broken x=1 (ticket 42)"
    assert b.state.raw == "MIXED+DRAIN" and not b.takes_placements
    assert b.why_not.startswith("draining: draining for maintenance")
    assert b.gpus_in_use == {0}
    assert c.state.raw == "IDLE+RESERVED" and not c.takes_placements
    assert c.why_not == "reserved (advance reservation)"


def test_down_node_takes_no_placements() -> None:
    got = nodes("nodes_down.txt")
    assert not got["gpu-c"].takes_placements
    assert got["gpu-c"].why_not == "down: GPU fell off the bus"
    assert got["gpu-a"].takes_placements and got["gpu-b"].takes_placements


def test_not_responding_node_takes_no_placements() -> None:
    got = nodes("nodes_not_responding.txt")
    b = got["gpu-b"]
    assert b.state.raw == "MIXED+NOT_RESPONDING"
    assert not b.takes_placements and b.why_not == "not responding"
    assert b.gpus_in_use == {0, 1}  # the job is still there as far as slurmctld knows
    assert got["gpu-a"].takes_placements


def test_unmapped_gres_type_is_named() -> None:
    with pytest.raises(UnmappedGresType) as e:
        parse_nodes(data("nodes_idle.txt"), {"a6000": A6000})
    assert e.value.gres_type == "rtx3090"
    assert "'rtx3090'" in str(e.value) and "node gpu-b" in str(e.value) and "a6000" in str(e.value)


def test_an_unmapped_gres_type_can_leave_only_its_gpus_out() -> None:
    """Issue 29.4: the service's inventory keeps the rest of the cluster when one type is unmapped."""
    nodes = {n.name: n for n in parse_nodes(data("nodes_idle.txt"), {"a6000": A6000}, skip_unmapped=True)}
    assert [g.index for g in nodes["gpu-a"].gpus] == [0, 1, 2, 3] and nodes["gpu-a"].problem is None
    assert nodes["gpu-b"].gpus == () and nodes["gpu-b"].unmapped == {"rtx3090": 2}
    assert "GRES type 'rtx3090' (2 GPUs) is not in c.GPUPool.slurm_gpu_models" in nodes["gpu-b"].problem
    # gpu-c keeps its A6000 at Slurm's index 0; the RTX 3090 (index 1) is left out
    assert [(g.index, g.model) for g in nodes["gpu-c"].gpus] == [(0, A6000)]
    assert nodes["gpu-c"].config()["gpus"] == [{"index": 0, "uuid": "gpu-c/gpu0", "model": A6000}]


@pytest.mark.parametrize(
    ("raw", "takes", "why"),
    [
        ("IDLE", True, None),
        ("MIXED", True, None),
        ("ALLOCATED", True, None),
        ("ALLOCATED+COMPLETING", True, None),
        ("IDLE+DRAIN", False, "drained"),
        ("MIXED+DRAIN", False, "draining"),
        ("IDLE*", False, "not responding"),
        ("DOWN*", False, "down, not responding"),
        ("DOWN+DRAIN+NOT_RESPONDING", False, "down, drained, not responding"),
        ("IDLE+RESERVED", False, "reserved (advance reservation)"),
        ("MIXED+NOT_RESPONDING", False, "not responding"),
        ("IDLE+CLOUD+POWERED_DOWN", False, "powered down"),
        ("IDLE+MAINTENANCE", False, "in maintenance"),
        ("FUTURE", False, "not yet in service (FUTURE)"),
        ("IDLE+SOMETHING_NEW", False, "something new"),
        ("drained", False, "drained"),  # sinfo's spelling
        ("mix~", False, "powered down"),
    ],
)
def test_node_states(raw: str, takes: bool, why: str | None) -> None:
    state = parse_node_state(raw)
    assert state.takes_placements is takes
    assert state.why_not == why


@pytest.mark.parametrize("raw", ["", "IDLE DRAIN", "IDLE++DRAIN", "3", "IDLE+"])
def test_unreadable_node_state(raw: str) -> None:
    with pytest.raises(SlurmOutputError, match="node state"):
        parse_node_state(raw)


def _line(name: str = "n1", **over: str) -> str:
    fields = {"NodeName": name, "CPUTot": "8", "CPUEfctv": "6", "RealMemory": "1000", "State": "IDLE",
              "Gres": "gpu:a6000:2", "GresUsed": "gpu:a6000:0(IDX:N/A)", "Partitions": "p"}
    fields.update(over)
    return " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)


def test_effective_cpus_exclude_specialised_cores() -> None:
    (n,) = parse_nodes(_line(), MODELS)
    assert n.cpus == 6 and n.config()["cpu_milli"] == 6000


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"RealMemory": "lots"}, "RealMemory='lots' is not a whole number"),
        ({"Gres": "gpu:2"}, "GPUs without a GRES type"),
        ({"GresUsed": "gpu:a6000:1(IDX:5)"}, "cannot tell which GPUs are free"),
        ({"GresUsed": "gpu:rtx3090:1(IDX:0)"}, "names GPU type 'rtx3090'"),
        ({"GresUsed": "gpu:a6000:1"}, "gives no GPU indices"),
        ({"GresUsed": "gpu:a6000:2(IDX:0)"}, "counts 2 but lists 1"),
        ({"Gres": "gpu:a6000:2(IDX:0"}, "unbalanced"),
        ({"State": None}, "State= is missing"),
        ({"State": "IDLE DRAIN"}, "node n1: cannot read node state"),
    ],
)
def test_bad_node_output_is_a_clear_error(over: dict, message: str) -> None:
    with pytest.raises(SlurmOutputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_nodes(_line(**over), MODELS)


def test_non_gpu_gres_is_ignored_and_sockets_are_read() -> None:
    (n,) = parse_nodes(_line(Gres="gpu:a6000:2(S:0-1),shard:a6000:8(S:0-1)",
                             GresUsed="gpu:a6000:1(IDX:1),shard:a6000:0(0/4,0/4)"), MODELS)
    assert [g.index for g in n.gpus] == [0, 1] and n.gpus_in_use == {1}


def test_node_without_gpus_and_garbage() -> None:
    (n,) = parse_nodes(_line(Gres="(null)", GresUsed="(null)"), MODELS)
    assert n.gpus == () and n.config()["gpus"] == []
    with pytest.raises(SlurmOutputError, match="no nodes"):
        parse_nodes("\n", MODELS)
    with pytest.raises(SlurmOutputError, match="starting with NodeName="):
        parse_nodes("slurm_load_node error: Unable to contact slurm controller\n", MODELS)
    with pytest.raises(SlurmOutputError, match="listed twice"):
        parse_nodes(_line() + "\n" + _line(), MODELS)


# ---------------------------------------------------------------------------
# jobs and the queue
# ---------------------------------------------------------------------------


def test_job_gpus_with_a_gap() -> None:
    job = parse_job(data("job_gap.txt"))
    assert job.job_id == 5 and job.name == "two gpus with gap" and job.user == "root"
    assert job.state == "RUNNING" and job.reason is None
    assert job.gpus == {"gpu-a": {"a6000": (1, 3)}}
    assert job.gpu_indices("gpu-a") == (1, 3)


def test_multi_node_job() -> None:
    job = parse_job(data("job_multinode.txt"))
    assert job.nodes == ("gpu-b", "gpu-c")
    assert job.gpus == {"gpu-b": {"rtx3090": (0,)}, "gpu-c": {"rtx3090": (1,)}}


def test_job_on_mixed_node_with_newline_in_comment_and_pipe_in_name() -> None:
    job = parse_job(data("job_mixed_node.txt"))
    assert job.name == "weird|name" and job.user == "daemon"
    assert job.gpus == {"gpu-c": {"a6000": (0,)}}


def test_pending_and_finished_jobs_hold_no_gpus() -> None:
    pending = parse_job(data("job_pending.txt"))
    assert pending.state == "PENDING" and pending.reason == "Resources" and pending.gpus == {}
    assert pending.nodes == ()
    done = parse_job(data("job_completed.txt"))
    assert done.state == "CANCELLED" and done.gpus == {} and done.nodes == ("gpu-c",)


def test_several_job_records_are_refused() -> None:
    two = data("job_gap.txt") + data("job_multinode.txt")
    with pytest.raises(SlurmOutputError, match="expected one job record, got 2"):
        parse_job(two)


def test_squeue() -> None:
    entries = {e.job_id: e for e in parse_squeue(data("squeue_all.txt"))}
    assert entries[8].state == "PENDING" and entries[8].reason == "Resources" and entries[8].nodes == ()
    assert entries[6].state == "RUNNING" and entries[6].reason is None and entries[6].nodes == ("gpu-b", "gpu-c")
    assert entries[7].name == "weird|name" and entries[7].user == "daemon"
    assert entries[2].state == "CANCELLED"
    with pytest.raises(SlurmOutputError, match="cannot read squeue line"):
        parse_squeue("JOBID PARTITION NAME\n")


# ---------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-a", ["gpu-a"]),
        ("gpu-a,gpu-c", ["gpu-a", "gpu-c"]),
        ("n[01-03,7]", ["n01", "n02", "n03", "n7"]),
        ("r[1-2]-n[8-9],x", ["r1-n8", "r1-n9", "r2-n8", "r2-n9", "x"]),
        ("None assigned", []),
        ("(null)", []),
    ],
)
def test_hostlists(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n[a-b]", "n[3-1]", "a,,b"])
def test_bad_hostlists(text: str) -> None:
    with pytest.raises(SlurmOutputError):
        expand_hostlist(text)


def test_index_lists() -> None:
    assert parse_index_list("0-1,3") == (0, 1, 3)
    assert parse_index_list("N/A") == () and parse_index_list("") == ()
    for bad in ("1-0", "a", "0,0", "0-"):
        with pytest.raises(SlurmOutputError):
            parse_index_list(bad)


def test_gres_entries() -> None:
    (a, b) = parse_gres("gpu:a6000:1(IDX:0),gpu:rtx3090:0(IDX:)")
    assert (a.type, a.count, a.indices) == ("a6000", 1, (0,))
    assert (b.type, b.count, b.indices) == ("rtx3090", 0, ())
    (c,) = parse_gres("gpu:4(S:0-1)")
    assert (c.type, c.count, c.extra) == (None, 4, (("S", "0-1"),))
    (d,) = parse_gres("gpu(IDX:0,2)")
    assert (d.count, d.indices) == (2, (0, 2))
    (e,) = parse_gres("shard:10K")
    assert e.count == 10 * 1024
    assert parse_gres("(null)") == []


def test_record_tokenizer() -> None:
    pairs = parse_record("A=1 OS=Linux 6.1 #1 SMP TRES=cpu=1,mem=2 Reason=x y=z Weight=1",
                         free_text=frozenset({"Reason"}), known=frozenset({"Weight"}))
    assert pairs == [("A", "1"), ("OS", "Linux 6.1 #1 SMP"), ("TRES", "cpu=1,mem=2"), ("Reason", "x y=z"),
                     ("Weight", "1")]
    with pytest.raises(SlurmOutputError):
        parse_record("no keys here")


# Anything Slurm might print, including truncated or corrupted lines, gives
# either nodes or a SlurmError, never an IndexError/KeyError/ValueError
# traceback from deep inside the parser.
_REAL_LINES = [ln for f in sorted(DATA.glob("nodes_*.txt")) for ln in f.read_text().splitlines() if ln]


@settings(max_examples=300, deadline=None)
@given(
    line=st.sampled_from(_REAL_LINES),
    cut=st.integers(min_value=0, max_value=2500),
    junk=st.text(alphabet=st.sampled_from(list("=:,()[]-+* \n0123456789abcXYZ/|")), max_size=12),
    at=st.integers(min_value=0, max_value=2500),
)
def test_mangled_node_output_gives_slurm_errors_only(line: str, cut: int, junk: str, at: int) -> None:
    text = line[: min(cut, len(line))] if cut < len(line) else line
    text = text[:at] + junk + text[at:]
    try:
        parse_nodes(text, MODELS)
    except SlurmError:
        pass


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_job_and_queue_text_gives_slurm_errors_only(text: str) -> None:
    for parse in (parse_job, parse_squeue):
        try:
            parse(text)
        except SlurmError:
            pass


# ---------------------------------------------------------------------------
# the I/O seam
# ---------------------------------------------------------------------------


def test_run_slurm_takes_argv_lists_only() -> None:
    with pytest.raises(TypeError, match="shell string"):
        run_slurm("scontrol show node")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run_slurm([])
    with pytest.raises(TypeError, match="NUL"):
        run_slurm(["echo", "a\0b"])


def test_run_slurm_errors_are_clear() -> None:
    with pytest.raises(SlurmCommandError, match="not found on PATH"):
        run_slurm(["gpupool-no-such-slurm-command"])
    with pytest.raises(SlurmCommandError, match=r"exit status 3: oops") as e:
        run_slurm([sys.executable, "-c", "import sys; sys.stderr.write('oops'); sys.exit(3)"])
    assert e.value.returncode == 3 and e.value.stderr == "oops"
    with pytest.raises(SlurmCommandError, match="did not answer within 0.2s"):
        run_slurm([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.2)


def test_run_slurm_forces_utc_epoch_times() -> None:
    out = run_slurm([sys.executable, "-c", "import os; print(os.environ['TZ'], os.environ['SLURM_TIME_FORMAT'])"],
                    env={"TZ": "Europe/Berlin", "PATH": "/usr/bin:/bin"})
    assert out.split() == ["UTC", "%s"]


def test_inventory_with_a_fake_runner() -> None:
    calls: list[list[str]] = []

    def runner(argv):
        calls.append(list(argv))
        if argv[0] == "scontrol" and argv[3] == "node":
            return data("nodes_busy.txt")
        if argv[0] == "scontrol":
            raise SlurmCommandError("'scontrol' failed with exit status 1: slurm_load_jobs error: Invalid job id "
                                    "specified", argv=argv, returncode=1)
        return data("squeue_all.txt")

    inv = SlurmInventory(MODELS, partitions=["big"], runner=runner)
    assert [n.name for n in inv.nodes()] == ["gpu-a"]
    assert inv.job(99) is None
    assert len(inv.queue()) == 8
    assert calls[0] == ["scontrol", "--details", "show", "node", "--oneliner"]
    assert calls[1] == ["scontrol", "--details", "show", "job", "--oneliner", "99"]
    with pytest.raises(ValueError):
        inv.job("5; rm -rf /")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        inv.queue(["1"])  # type: ignore[list-item]


def test_no_slurm_client_is_a_command_error() -> None:
    inv = SlurmInventory(MODELS, env={"PATH": "/nonexistent"})
    with pytest.raises(SlurmCommandError, match="scontrol not found"):
        inv.nodes()


def test_subprocess_is_not_a_shell() -> None:
    # an argument with shell syntax reaches the program verbatim
    out = run_slurm([sys.executable, "-c", "import sys; print(sys.argv[1])", "$(id); `id`"])
    assert out.strip() == "$(id); `id`"
