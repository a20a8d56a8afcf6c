"""Attribution of real processes to real Unix users, and the /metrics endpoint that exports it."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool_hub.agent.attribution import kernel_id, take_snapshot
from gpupool_hub.agent.metrics import AgentMetrics
from gpupool_hub.agent.nvml import list_gpus, nvml_session
from gpupool_hub.agent.servers import ServerRecords
from gpupool_hub.usage.prometheus import build_query
from tests.agent.conftest import A100, gpu

MIB = 1 << 20
DEAD_PID = 4_000_000  # above pid_max's default: never a live process


def snapshot(nv):
    with nvml_session(nv):
        return take_snapshot(nv, list_gpus(nv))


def scrape(port: int) -> dict[str, list]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def test_gpu_processes_are_attributed_to_their_unix_users(procs, test_users, make_nvml):
    a1, a2, b1 = procs.sleeper("gpupool-t1"), procs.sleeper("gpupool-t1"), procs.sleeper("gpupool-t2")
    root = procs.sleeper(None)
    nv = make_nvml([
        gpu(0, processes=[{"pid": a1.pid, "memory": 100 * MIB}, {"pid": b1.pid, "memory": 300 * MIB},
                          {"pid": root.pid, "memory": 5 * MIB, "kind": "graphics"}]),
        # a1 uses two GPUs; a2 shows in both the compute and graphics list (one process, counted once)
        gpu(1, processes=[{"pid": a1.pid, "memory": 50 * MIB}, {"pid": a2.pid, "memory": 70 * MIB},
                          {"pid": a2.pid, "memory": 70 * MIB, "kind": "graphics"},
                          {"pid": DEAD_PID, "memory": 1 * MIB}]),
    ])
    snap = snapshot(nv)
    seen = {(p.pid, p.gpu_index): p for p in snap.processes}
    assert len(seen) == len(snap.processes) == 6
    assert (seen[(a1.pid, 0)].user, seen[(a1.pid, 0)].uid) == ("gpupool-t1", test_users["gpupool-t1"])
    assert seen[(a1.pid, 1)].user == seen[(a2.pid, 1)].user == "gpupool-t1"
    assert seen[(b1.pid, 0)].user == "gpupool-t2"
    assert (seen[(root.pid, 0)].user, seen[(root.pid, 0)].uid, seen[(root.pid, 0)].kinds) == ("root", 0, ("graphics",))
    assert seen[(a2.pid, 1)].kinds == ("compute", "graphics") and seen[(a2.pid, 1)].memory_bytes == 70 * MIB
    assert seen[(DEAD_PID, 1)].user is None and seen[(DEAD_PID, 1)].uid is None
    assert not any(p.is_kernel for p in snap.processes)
    assert [(g.uuid, g.utilization) for g in snap.gpus] == [("GPU-0000-fake", 0.40), ("GPU-0001-fake", 0.41)]


def test_jupyter_kernels_and_their_recorded_running_server_are_recognised(procs, make_nvml, server_records):
    server, kernel = procs.server_with_kernel("gpupool-t1", server_records)
    impostor, job = procs.server_with_kernel("gpupool-t1", program="jupyter-lab")  # named so, not recorded
    orphan = procs.orphan_kernel("gpupool-t1")
    nv = make_nvml([gpu(0, processes=[{"pid": kernel}, {"pid": orphan.pid}, {"pid": job}])])
    with nvml_session(nv):
        snap = take_snapshot(nv, list_gpus(nv), servers=ServerRecords(str(server_records)))
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[kernel].kernel_id == "1234-abcd" and by_pid[kernel].server_pid == server.pid
    assert by_pid[kernel].is_kernel_of_running_server
    assert by_pid[job].kernel_id == "1234-abcd" and by_pid[job].server_pid is None
    assert not by_pid[job].is_kernel_of_running_server and impostor.poll() is None
    assert by_pid[orphan.pid].kernel_id == "0rphan" and by_pid[orphan.pid].server_pid is None
    assert not by_pid[orphan.pid].is_kernel_of_running_server
    # without the hub's records (a Slurm or Kubernetes node) no kernel is a running server's
    assert not any(p.is_kernel_of_running_server for p in snapshot(nv).processes)


@pytest.mark.parametrize("cmdline,expected", [
    (["/opt/conda/bin/python", "-m", "ipykernel_launcher", "-f", "/home/u/.local/share/jupyter/runtime/kernel-3f2a.json"], "3f2a"),
    (["python", "-m", "ipykernel_launcher", "--f=/run/user/1000/jupyter/kernel-v2-123-abc.json"], "v2-123-abc"),
    (["/usr/lib/R/bin/exec/R", "--slave", "-e", "IRkernel::main()", "--args", "/tmp/kernel-r1.json"], None),
    (["julia", "-i", "kernel.jl", "-f", "/tmp/kernel-jl.json"], "jl"),
    (["python", "-m", "ipykernel", "install"], ""),
    (["python", "train.py", "-f", "config.json"], None),
    (["jupyter", "console", "--existing", "kernel-1.json"], None),
    ([], None),
])
def test_kernel_detection_from_the_command_line(cmdline, expected):
    assert kernel_id(cmdline) == expected


def test_metrics_endpoint_exports_users_and_gpus_and_drops_ended_usage(procs, make_nvml):
    a, b, root = procs.sleeper("gpupool-t1"), procs.sleeper("gpupool-t2"), procs.sleeper(None)
    nv = make_nvml([
        gpu(0, processes=[{"pid": a.pid, "memory": 100 * MIB}, {"pid": b.pid, "memory": 300 * MIB},
                          {"pid": root.pid, "memory": 1 * MIB}]),
        gpu(1, processes=[{"pid": a.pid, "memory": 50 * MIB}, {"pid": DEAD_PID}], utilization=0),
    ])
    metrics = AgentMetrics("node-a", metrics_min_uid=100)  # the test users have system-range uids
    server = metrics.serve(0, "127.0.0.1")
    try:
        metrics.update(snapshot(nv))
        m = scrape(server.server_port)

        active = {(s.labels["user"], s.labels["gpu_uuid"]): s.value for s in m["gpupool_agent_user_gpu_active"]}
        assert active == {("gpupool-t1", "GPU-0000-fake"): 1, ("gpupool-t1", "GPU-0001-fake"): 1,
                          ("gpupool-t2", "GPU-0000-fake"): 1}
        # exactly the labels the service's usage preset "agent" aggregates over
        assert all(set(s.labels) == {"user", "gpu_uuid", "model", "node"} for s in m["gpupool_agent_user_gpu_active"])
        assert {s.labels["model"] for s in m["gpupool_agent_user_gpu_active"]} == {A100}
        assert {s.labels["node"] for s in m["gpupool_agent_user_gpu_active"]} == {"node-a"}
        assert "gpupool_agent_user_gpu_active" in build_query("agent")

        memory = {(s.labels["user"], s.labels["gpu_uuid"]): s.value for s in m["gpupool_agent_user_gpu_memory_bytes"]}
        assert memory[("gpupool-t2", "GPU-0000-fake")] == 300 * MIB
        assert memory[("gpupool-t1", "GPU-0001-fake")] == 50 * MIB
        count = {(s.labels["user"], s.labels["gpu_uuid"]): s.value for s in m["gpupool_agent_user_gpu_processes"]}
        assert count[("gpupool-t1", "GPU-0000-fake")] == 1
        other = {(s.labels["gpu_uuid"], s.labels["kind"]): s.value for s in m["gpupool_agent_gpu_other_processes"]}
        assert other == {("GPU-0000-fake", "system"): 1, ("GPU-0001-fake", "unknown"): 1}  # root, invisible pid

        util = {s.labels["gpu_uuid"]: s.value for s in m["gpupool_agent_gpu_utilization_ratio"]}
        assert util == {"GPU-0000-fake": 0.40, "GPU-0001-fake": 0.0}
        assert {s.value for s in m["gpupool_agent_gpu_memory_total_bytes"]} == {80 << 30}
        assert {s.value for s in m["gpupool_agent_gpu_memory_used_bytes"]} == {2 << 30}

        # t2's process ends: its series disappear (no stale 1 to bill)
        nv.table["gpus"][0]["processes"] = [{"pid": a.pid, "memory": 100 * MIB}]
        metrics.update(snapshot(nv))
        m = scrape(server.server_port)
        assert {s.labels["user"] for s in m["gpupool_agent_user_gpu_active"]} == {"gpupool-t1"}

        # NVML fails: no usage is claimed at all
        metrics.update(None)
        m = scrape(server.server_port)
        assert m["gpupool_agent_user_gpu_active"] == []
    finally:
        server.shutdown()
        server.server_close()


def test_default_metrics_min_uid_keeps_system_accounts_out_of_user_series(procs, make_nvml):
    a = procs.sleeper("gpupool-t1")  # uid < 1000
    metrics = AgentMetrics("n")
    metrics.update(snapshot(make_nvml([gpu(0, processes=[{"pid": a.pid}])])))
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    assert "gpupool_agent_user_gpu_active{" not in text
    assert 'gpupool_agent_gpu_other_processes{gpu_uuid="GPU-0000-fake",index="0",kind="system"' in text
