"""The Slurm inventory against the real test cluster (tests/fixtures/slurm.py)."""

from __future__ import annotations

import pytest

from gpupool_hub.engines.slurm import SlurmCommandError, SlurmInventory, UnmappedGresType
from gpupool_hub.placement import Pool, load_nodes
from tests.fixtures.slurm import MODELS, SlurmCluster, poll

pytestmark = pytest.mark.integration

A6000, RTX3090 = MODELS["a6000"], MODELS["rtx3090"]


def inventory(slurm: SlurmCluster, **kw) -> SlurmInventory:
    return SlurmInventory(MODELS, env=slurm.env, **kw)


def test_nodes_match_the_cluster(slurm: SlurmCluster) -> None:
    nodes = {n.name: n for n in inventory(slurm).nodes()}
    assert set(nodes) == {"gpu-a", "gpu-b", "gpu-c"}
    assert [g.model for g in nodes["gpu-a"].gpus] == [A6000] * 4
    assert [g.model for g in nodes["gpu-b"].gpus] == [RTX3090] * 2
    assert [(g.index, g.model) for g in nodes["gpu-c"].gpus] == [(0, A6000), (1, RTX3090)]
    assert nodes["gpu-a"].cpus == 8 and nodes["gpu-a"].memory_mib == 16000
    assert nodes["gpu-a"].partitions == ("gpu", "big") and nodes["gpu-a"].features == ("ampere", "nvlink")
    assert all(n.takes_placements for n in nodes.values())
    pool = Pool(load_nodes(inventory(slurm).node_configs()))
    assert pool is not None


def test_partition_filter(slurm: SlurmCluster) -> None:
    assert [n.name for n in inventory(slurm, partitions=["big"]).nodes()] == ["gpu-a"]


def test_foreign_jobs_show_as_gpus_in_use(slurm: SlurmCluster) -> None:
    inv = inventory(slurm)
    j1 = slurm.submit_foreign_job("gpu-a", "gpu:a6000:1")
    j2 = slurm.submit_foreign_job("gpu-a", "gpu:a6000:2", user="daemon")
    j3 = slurm.submit_foreign_job("gpu-c", "gpu:rtx3090:1")
    bound = {j: inv.job(j) for j in (j1, j2, j3)}
    a_used = set(bound[j1].gpu_indices("gpu-a")) | set(bound[j2].gpu_indices("gpu-a"))
    assert len(a_used) == 3
    assert bound[j2].user == "daemon" and bound[j2].gpus == {"gpu-a": {"a6000": bound[j2].gpu_indices("gpu-a")}}
    assert bound[j3].gpus == {"gpu-c": {"rtx3090": (1,)}}  # the mixed node's rtx3090 is index 1

    nodes = {n.name: n for n in inv.nodes()}
    assert nodes["gpu-a"].gpus_in_use == a_used
    assert nodes["gpu-a"].used_by_type() == {"a6000": 3}
    assert nodes["gpu-c"].gpus_in_use == {1} and nodes["gpu-c"].used_by_type() == {"a6000": 0, "rtx3090": 1}
    assert nodes["gpu-b"].gpus_in_use == frozenset()
    assert nodes["gpu-a"].takes_placements  # MIXED

    # giving GPUs back frees exactly those
    slurm.cancel(j2)
    slurm.wait_job_done(j2)
    poll(lambda: {n.name: n for n in inv.nodes()}["gpu-a"].gpus_in_use == set(bound[j1].gpu_indices("gpu-a")),
         20, "gpu-a to free the GPUs of the cancelled job")


def test_queue_states_and_pending_reason(slurm: SlurmCluster) -> None:
    inv = inventory(slurm)
    running = slurm.submit_foreign_job("gpu-b", "gpu:rtx3090:2")
    waiting = slurm.submit(gres="gpu:rtx3090:1", node="gpu-b", name="waits|for gpu-b", wait_running=False)
    poll(lambda: {e.job_id: e for e in inv.queue([running, waiting])}.get(waiting, None)
         and {e.job_id: e for e in inv.queue([running, waiting])}[waiting].reason == "Resources", 20,
         "the second job to wait for resources")
    entries = {e.job_id: e for e in inv.queue([running, waiting])}
    assert entries[running].state == "RUNNING" and entries[running].reason is None
    assert entries[running].nodes == ("gpu-b",)
    assert entries[waiting].state == "PENDING" and entries[waiting].name == "waits|for gpu-b"
    job = inv.job(waiting)
    assert job is not None and job.state == "PENDING" and job.reason == "Resources" and job.gpus == {}


def test_unknown_jobs(slurm: SlurmCluster) -> None:
    inv = inventory(slurm)
    assert inv.job(987654) is None
    assert inv.queue([987654]) == []


def test_drained_down_and_reserved_nodes(slurm: SlurmCluster) -> None:
    inv = inventory(slurm)
    slurm.submit_foreign_job("gpu-b", "gpu:rtx3090:1")
    slurm.run(["scontrol", "update", "NodeName=gpu-a", "State=DRAIN", "Reason=bad fan x=1"])
    slurm.run(["scontrol", "update", "NodeName=gpu-b", "State=DRAIN", "Reason=maintenance"])
    slurm.run(["scontrol", "create", "Reservation=test", "StartTime=now", "Duration=10", "Nodes=gpu-c",
               "Users=root"])
    poll(lambda: "RESERVED" in {n.name: n for n in inv.nodes()}["gpu-c"].state.raw, 20, "the reservation")
    nodes = {n.name: n for n in inv.nodes()}
    # slurmctld's "[root@<time>]" after the admin's words is not for users (issue 48.9)
    assert nodes["gpu-a"].why_not == "drained: bad fan x=1"
    assert nodes["gpu-b"].why_not == "draining: maintenance"
    assert nodes["gpu-c"].why_not == "reserved (advance reservation)"
    assert not any(n.takes_placements for n in nodes.values())
    slurm.run(["scontrol", "delete", "ReservationName=test"])
    slurm.run(["scontrol", "update", "NodeName=gpu-c", "State=DOWN", "Reason=gone"])
    nodes = {n.name: n for n in inv.nodes()}
    assert nodes["gpu-c"].why_not == "down: gone"
    # the fixture's reset resumes the nodes for the next test


def test_unmapped_type_and_unreachable_cluster(slurm: SlurmCluster) -> None:
    with pytest.raises(UnmappedGresType, match="'rtx3090'"):
        SlurmInventory({"a6000": A6000}, env=slurm.env).nodes()
    # a missing slurm.conf makes scontrol look for the controller in DNS: it
    # fails or hangs, either way a SlurmCommandError within the timeout
    broken = SlurmInventory(MODELS, env={**slurm.env, "SLURM_CONF": str(slurm.root / "missing.conf")}, timeout=3)
    with pytest.raises(SlurmCommandError, match="'scontrol --details show node --oneliner' (failed|did not answer)"):
        broken.nodes()


def test_an_unmapped_gres_type_leaves_the_other_gpus_and_nodes_in_service(slurm: SlurmCluster, tmp_path) -> None:
    """Issue 29.4: a GRES type missing from the map stopped the service, and the hub with it. Now
    the service's source leaves only that type's GPUs out, says so per node in GET pool, and
    the rest of the cluster takes servers."""
    from gpupool_hub.engines.slurm.inventory import SlurmInventorySource
    from gpupool_hub.placement import Request
    from tests.fixtures.manager import make_manager

    source = SlurmInventorySource({"a6000": A6000}, env=slurm.env)  # rtx3090 is missing
    m = make_manager([], {"RTX A6000": 4}, f"sqlite:///{tmp_path}/ledger.sqlite", source=source,
                     inventory="slurm", slurm_gpu_models={"a6000": A6000})
    m.inventory.apply_node_status(source.node_status())
    report = {n["node"]: n for n in m.views.pool_report([], {})["nodes"]}
    assert "problem" not in report["gpu-a"]
    for node in ("gpu-b", "gpu-c"):
        assert "GRES type 'rtx3090'" in report[node]["problem"] and "slurm_gpu_models" in report[node]["problem"]
    assert [g["index"] for g in report["gpu-c"]["gpus"]] == [0]  # its A6000 stays in service
    got = [m.admission.admit(f"u{i}", [], "", Request(gpus=1), ["RTX A6000"]) for i in range(5)]
    assert sorted(a.node for a in got) == ["gpu-a"] * 4 + ["gpu-c"]


async def test_48_2_reconcile_releases_a_stopped_servers_allocation_once_slurm_no_longer_has_its_job(
        slurm: SlurmCluster, tmp_path) -> None:
    """Issue 48.2 after a hub restart: the spawner that waited for a stopped server's job to end is gone.
    The allocation stays held (and charged) while Slurm still has the job, and is released once it has not."""
    import asyncio

    from gpupool_hub.placement import Request
    from gpupool_hub.service.jobs.reconcile import ReconcileJob
    from tests.fixtures.manager import make_manager
    from tests.service.test_allocation_states import HubWithoutServers

    nodes = [{"name": "gpu-a", "cpu_milli": 8000, "memory_mib": 16000,
              "gpus": [{"index": 0, "uuid": "gpu-a/0", "model": MODELS["a6000"]}]}]
    m = make_manager(nodes, {"A6000": 1}, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    alloc = m.admission.admit("carol", [], "", Request(gpus=1), None)
    m.admission.stopping(alloc.id)
    job = slurm.submit(gres="gpu:a6000:1", node="gpu-a", comment=f"gpupool-allocation={alloc.id}",
                       name="gpupool-server")
    inventory = SlurmInventory(MODELS, env=slurm.env)

    async def alive() -> set[str]:
        return await asyncio.get_running_loop().run_in_executor(None, inventory.hub_allocations)

    reconcile = ReconcileJob(HubWithoutServers(), m.records, m.admission, grace=0, engine_work=alive)
    await reconcile()
    assert [r.id for r in m.ledger.allocations.active()] == [alloc.id]  # the job runs: held
    slurm.stop_slurmctld()
    try:
        await reconcile()  # slurmctld cannot say: held
        assert [r.id for r in m.ledger.allocations.active()] == [alloc.id]
    finally:
        slurm.start_slurmctld()
    slurm.cancel(job)
    slurm.wait_job_done(job)
    await reconcile()
    assert m.ledger.allocations.active() == []
    [released] = [r for r in m.ledger.allocations.overlapping(alloc.created_at, alloc.created_at.replace(year=2100))]
    assert released.release_reason == "reconcile: its stopped job has ended"
