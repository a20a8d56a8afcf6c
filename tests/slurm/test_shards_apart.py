"""Issue 48.4: a configuration that keeps shares on GPUs Slurm never gives whole, on a real cluster.

Slurm 22.05.8 forgets a GPU's shards when one of two shard jobs on it ends, and then gives the GPU
whole to the next job (``test_shards.py`` shows it). A GPU that only shard jobs can reach cannot
be given whole. Slurm does not let a node offer shards without ``gres/gpu``: its slurmd stops with
"fatal: failed to merge SHARED and SHARING configuration". So the shares get their own GPUs by
*type* and *partition*, as docs/slurm.md ("Shares apart") gives them:

- the share nodes' GPUs have a GRES type of their own (``a6000s``), mapped to a model name that no
  whole-GPU profile matches (``"A6000-shares"``): the pool never books a whole GPU there;
- the share nodes are in a partition of their own (``shares``) that is not the default one: a plain
  ``sbatch --gres=gpu:1`` never lands there; the share profile submits to it
  (``spawner_override: req_partition``).

Here the lost shards happen (one of two halves stops), and still no GPU of the share node is ever
given whole, by the hub or by plain sbatch, and the service sees nothing shared.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpupool_hub.engines.slurm import SlurmInventory
from tests.fixtures.hub import wait_for
from tests.fixtures.slurm import NodeSpec, running_cluster
from tests.fixtures.unix_accounts import unix_account  # noqa: F401 (fixture)
from tests.slurm.test_spawner_hub import PROFILES, slurm_config
from tests.spawner.conftest import allocations, set_balance, spawn, spawner_hub, stop_server, wait_spawned

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

NODES = (NodeSpec("apart-w", cpus=8, memory_mib=16000, gpus=(("a6000", 1),)),
         NodeSpec("apart-s", cpus=8, memory_mib=16000, gpus=(("a6000s", 2),)))
TYPES = {"a6000": "NVIDIA RTX A6000", "a6000s": "A6000-shares"}
HALF = {"slug": "half", "display_name": "Half a shared A6000", "gpu_fraction": 0.5, "models": ["A6000-shares"],
        "cpu": 1, "memory": "1G", "spawner_override": {"req_partition": "shares"}}


@pytest.fixture(scope="module")
def apart_cluster():
    yield from running_cluster(NODES, {"gpu": ["apart-w"], "shares": ["apart-s"]}, shards=8, accounting=False)


@pytest.fixture(scope="module")
def apart_hub(tmp_path_factory, apart_cluster):
    workdir = tmp_path_factory.mktemp("aparthub")
    config = slurm_config(workdir, apart_cluster) + (
        f"c.GPUPool.slurm_gpu_models = {TYPES!r}\n"
        f"c.GPUPool.prices = {json.dumps({'RTX A6000': 4, 'A6000-shares': 4})}\n"
        f"c.GPUPoolSpawner.profiles = {[*PROFILES, HALF]!r}\n"
    )
    yield from spawner_hub(tmp_path_factory, "aparthub", config)


def node_problem(hub, node: str) -> str:
    r = hub.service("GET", "/pool", hub.tester_token)
    r.raise_for_status()
    return next((n.get("problem") or "" for n in r.json()["nodes"] if n["node"] == node), "")


def whole_on_share_node(cluster) -> list[int]:
    """Jobs holding a GPU of the share node whole."""
    inventory = SlurmInventory(TYPES, env=cluster.env)
    return [j for j in cluster.job_ids() if (job := inventory.job(j)) is not None and job.gpu_indices("apart-s")]


def test_shares_on_their_own_gpus_are_never_given_whole(apart_hub, apart_cluster, unix_account):
    hub, cluster = apart_hub, apart_cluster
    h1, h2, w1, w2 = (unix_account(p) for p in ("aparth", "aparti", "apartw", "apartx"))
    for u in (h1, h2, w1, w2):
        set_balance(hub, u, "100")
    jobs = []
    try:
        for u in (h1, h2):
            ok, message = wait_spawned(hub, u, "", spawn(hub, u, {"profile": "half"}))
            assert ok, f"{u}: {message}\n{hub.log_tail(40)}"
        halves = {a["user"]: a for a in allocations(hub)}
        assert {a["node"] for a in halves.values()} == {"apart-s"}
        assert [Decimal(g["fraction"]) for a in halves.values() for g in a["gpus"]] == [Decimal("0.5")] * 2
        ok, message = wait_spawned(hub, w1, "", spawn(hub, w1, {"profile": "a6000"}))
        assert ok, message
        assert [a["node"] for a in allocations(hub) if a["user"] == w1] == ["apart-w"]
        stop_server(hub, h1)  # one of the two shard jobs ends: Slurm 22.05 forgets the other's shards
        wait_for(lambda: all(a["user"] != h1 for a in allocations(hub)), 60, "the first half to be released")
        # a second whole GPU: the pool has none (it never books one on the share node)
        r = spawn(hub, w2, {"profile": "a6000"})
        ok, message = wait_spawned(hub, w2, "", r) if r.status_code < 400 else (False, r.text)
        assert not ok, message
        # plain sbatch asking any GPU waits for apart-w, never takes a GPU of the share node
        jobs.append(cluster.submit(gres="gpu:1", name="plain", wait_running=False))
        jobs.append(cluster.submit(gres="gpu:a6000:1", name="typed", wait_running=False))
        wait_for(lambda: all(cluster.job_state(j) == "PENDING" for j in jobs), 30, "the plain jobs to wait")
        assert whole_on_share_node(cluster) == []
        assert "given whole" not in node_problem(hub, "apart-s")
    finally:
        cluster.cancel(*jobs)
        for u in (h1, h2, w1, w2):
            stop_server(hub, u)
        wait_for(lambda: not allocations(hub), 60, "the allocations to be released")
        cluster.reset()
