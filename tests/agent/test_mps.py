"""Issue 23 item 4, guarantee classes: an ``mps`` share is capped through its GPU's MPS control
daemon, a ``timeslice`` overrun is noticed, then stopped within 20 s by default.

The real agent against the real service, with real processes of two real (test) Unix users;
NVML is the fake one, and NVIDIA's control daemon the stand-in ``tests/agent/mps_standin.py``,
which records the commands it receives.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

from traitlets.config import Config

from gpupool_hub.agent.enforce import TERMINATED
from gpupool_hub.service.core.admission import parse_request
from tests.agent.conftest import alive
from tests.agent.test_memguard import ALICE, BOB, start, table
from tests.agent.test_service import make_agent
from tests.service.openapi import check

STANDIN = str(Path(__file__).with_name("mps_standin.py"))


def commands(root: Path, uuid: str) -> list[str]:
    """What the GPU's control daemon was told: ``-d`` for a start, else the stdin command."""
    path = root / uuid / "commands.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert all(r["gpu"] == uuid and r["pipe"] == str(root / uuid / "pipe") for r in rows), rows
    return ["-d" if r["argv"] == ["-d"] else r["stdin"] for r in rows]


def stop_daemons(root: Path) -> None:
    """The stand-in daemons this test started (the real ones outlive the agent by design)."""
    for pid_file in root.glob("*/pipe/nvidia-cuda-mps-control.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


async def test_an_mps_share_is_capped_through_its_gpus_control_daemon(tmp_path, procs, test_users, make_nvml):
    svc = start(tmp_path)
    root = tmp_path / "mps"
    try:
        m = svc.manager
        record = m.admission.admit(ALICE, [], "", parse_request({"gpu_fraction": "0.6", "share": "mps"}))
        uuid = record.gpus[0]["uuid"]
        neighbour = m.admission.admit(BOB, [], "", parse_request({"gpu_fraction": "0.25"}))
        assert neighbour.gpus[0]["uuid"] == uuid  # a timeslice share of another user beside it

        # the spawner points the server at the daemon's pipes
        from gpupool_hub.engines.local.spawner import GPUPoolLocalProcessSpawner
        spawner = GPUPoolLocalProcessSpawner(config=Config(), user=SimpleNamespace(name=ALICE), mps_root=str(root))
        allocation = m.views.allocation_json(record)
        check("Allocation", allocation)
        assert allocation["gpus"][0]["share"] == "mps"
        env = spawner.gpupool_env(allocation)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{root}/{uuid}/pipe" and env["CUDA_VISIBLE_DEVICES"] == uuid
        assert "CUDA_MPS_PIPE_DIRECTORY" not in spawner.gpupool_env(m.views.allocation_json(neighbour))

        code, shares = await svc.call("GET", "nodes/n1/memory", "secret-n1")
        assert code == 200 and {(s["user"], s["class"]) for s in shares["shares"]} == {(ALICE, "mps"), (BOB, "timeslice")}

        a, b = procs.sleeper(ALICE), procs.sleeper(BOB)
        agent = make_agent(make_nvml(table({uuid: [(a.pid, 10), (b.pid, 5)]})), svc.url,
                           mps_control=STANDIN, mps_root=str(root))
        result = await agent.tick()
        assert result.service_ok and result.mps_failed == []
        # 0.6 of an 80 GiB GPU: 49152 MiB, 60 % of its SMs; the server is started capped, for alice's uid
        assert commands(root, uuid) == [
            "-d", "set_default_device_pinned_mem_limit 0 49152M", "set_default_active_thread_percentage 60",
            "get_server_list", f"start_server -uid {test_users[ALICE]}"]
        assert oct(os.stat(root / uuid / "pipe").st_mode & 0o777) == "0o755"

        await agent.tick()  # the server runs now: its own caps are set too
        server = int((root / uuid / "pipe" / "servers").read_text())
        assert commands(root, uuid)[5:] == [
            "get_server_list", f"set_device_pinned_mem_limit {server} 0 49152M",
            f"set_active_thread_percentage {server} 60"]
        await agent.tick()  # nothing changed: nothing is set again
        assert commands(root, uuid)[8:] == ["get_server_list"]
        assert [p.name for p in root.iterdir() if p.is_dir()] == [uuid]  # no daemon for other GPUs
        assert alive(a.pid) and alive(b.pid)
    finally:
        stop_daemons(root)
        svc.stop()


async def test_a_failing_control_daemon_is_reported_and_the_guard_still_watches(tmp_path, procs, test_users,
                                                                                 make_nvml, caplog):
    svc = start(tmp_path)
    root = tmp_path / "mps"
    try:
        record = svc.manager.admission.admit(ALICE, [], "", parse_request({"gpu_fraction": 0.6, "share": "mps"}))
        uuid = record.gpus[0]["uuid"]
        hog = procs.sleeper(ALICE)
        agent = make_agent(make_nvml(table({uuid: [(hog.pid, 70)]})), svc.url, mps_control="/bin/false",
                           mps_root=str(root))
        result = await agent.tick()
        assert len(result.mps_failed) == 1 and uuid in result.mps_failed[0]
        assert f"Could not cap the mps share of {ALICE} on GPU {uuid}" in caplog.text
        assert [w.usage.user for w in result.memory_warnings] == [ALICE]  # 70 GiB over the 52.8 GiB limit
    finally:
        svc.stop()


async def test_a_timeslice_overrun_gets_a_notice_then_a_stop_within_20_s_by_default(
        tmp_path, procs, test_users, make_nvml):
    svc = start(tmp_path)
    try:
        m = svc.manager
        shared = m.admission.admit(ALICE, [], "", parse_request({"gpu_fraction": 0.5})).gpus[0]["uuid"]
        assert m.admission.admit(BOB, [], "", parse_request({"gpu_fraction": 0.5})).gpus[0]["uuid"] == shared
        hog, neighbour = procs.sleeper(ALICE), procs.sleeper(BOB)
        nv = make_nvml(table({shared: [(hog.pid, 20), (neighbour.pid, 30)]}))
        agent = make_agent(nv, svc.url)  # the defaults: interval 15 s, memory_interval 3 s, memory_grace 10 s
        assert (agent.interval, agent.memory_interval, agent.memory_grace) == (15.0, 3.0, 10.0)
        runner = asyncio.create_task(agent.run())
        try:
            deadline = time.monotonic() + 10
            while not agent.share_steps.shares:  # the first tick has asked for the shares
                assert time.monotonic() < deadline, "the agent never asked for its shares"
                await asyncio.sleep(0.05)
            nv.table["gpus"] = table({shared: [(hog.pid, 60), (neighbour.pid, 30)]})  # the overrun
            overrun = time.monotonic()
            noticed = None
            while alive(hog.pid):
                assert time.monotonic() - overrun < 20, "not stopped within 20 s of the overrun"
                if noticed is None:
                    code, me = await svc.call("GET", "me", "alice-token")
                    if code == 200 and me["memory_warnings"]:
                        noticed = time.monotonic()
                await asyncio.sleep(0.1)
            stopped = time.monotonic()
        finally:
            agent.stop()
            await runner
        assert noticed is not None and noticed < stopped  # the notice came first
        hog.wait(5)
        assert hog.returncode == -signal.SIGTERM
        assert alive(neighbour.pid)  # the neighbour, within its share, is untouched
        stops = [e for e in m.ledger.audit.page(user=ALICE) if e.action == "memory_stop"]
        assert len(stops) == 1 and TERMINATED in stops[0].reason
        assert [e for e in m.ledger.audit.page(user=BOB)] == []
    finally:
        svc.stop()
