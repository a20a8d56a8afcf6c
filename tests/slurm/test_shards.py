"""Issue 40.3: GPU shares on Slurm through ``gres/shard``, against a real cluster with shards.

``shard_slurm_cluster`` runs Slurm 22.05 with ``GresTypes=gpu,shard``, a node
``Gres=gpu:a6000:2,shard:a6000:16`` and, in gres.conf, one
``Name=shard Type=a6000 Count=8 File=<the GPU's device file>`` line per GPU (the
lines docs/slurm.md gives). What Slurm does with them, seen here: a job asking
``--gres=shard:a6000:4`` gets 4 shards of one GPU, the first with room, and
``scontrol -d show job`` names it (``GRES=shard:a6000:4(IDX:0)``); a job cannot
name the GPU. The node shows which GPUs have shards in use
(``GresUsed=gpu:a6000:0(IDX:N/A),shard:a6000:2(IDX:0-1)``: a count of GPUs, not of
shards), and a GPU with shards in use is not given whole, nor shards of a GPU
given whole. So the pool picks the node, Slurm the GPU, and the spawner moves the
pool's share to that GPU.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from decimal import Decimal

import pytest

from gpupool_hub.engines.slurm import SlurmInventory
from tests.fixtures.hub import wait_for
from tests.fixtures.slurm import MODELS, NodeSpec, running_cluster
from tests.fixtures.unix_accounts import unix_account  # noqa: F401 (fixture)
from tests.slurm.test_spawner_hub import PROFILES, inventory_refreshes, pool_gpus, slurm_config
from tests.slurm.test_usage_config import start
from tests.spawner.conftest import allocations, set_balance, spawn, spawner_hub, stop_server, wait_spawned

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

#: one node, so that the pool's node is Slurm's; two A6000s of 8 shards each: half a GPU is 4 shards
SHARD_NODES = (NodeSpec("sgpu-a", cpus=8, memory_mib=16000, gpus=(("a6000", 2),)),)
SHARDS = 8
HALF = {"slug": "half-a6000", "display_name": "Half an RTX A6000", "gpu_fraction": 0.5,
        "models": ["RTX A6000"], "cpu": 1, "memory": "1G"}
SHARE_PROFILES = [*PROFILES, HALF]
HALF_GPU = Decimal("0.5")


@pytest.fixture(scope="module")
def shard_slurm_cluster():
    # confined as a production cluster is (ConstrainDevices=yes: issue 48 asks its Slurm tests to run so)
    yield from running_cluster(SHARD_NODES, {"gpu": ["sgpu-a"]}, shards=SHARDS, accounting=False,
                               constrain_devices=True)


@pytest.fixture(scope="module")
def shard_hub(tmp_path_factory, shard_slurm_cluster):
    workdir = tmp_path_factory.mktemp("shardhub")
    config = (slurm_config(workdir, shard_slurm_cluster) + f"c.GPUPoolSpawner.profiles = {SHARE_PROFILES!r}\n"
              # the cluster confines jobs to their GPUs: the start check must accept it, as in production
              + "c.GPUPool.slurm_allow_env_only_gpu_hiding = False\n")
    for hub in spawner_hub(tmp_path_factory, "shardhub", config):
        hub.slurm_workdir = workdir
        yield hub


def server_jobs(cluster) -> dict[int, object]:
    inventory = SlurmInventory(MODELS, env=cluster.env)
    jobs = {j: inventory.job(j) for j in cluster.job_ids()}
    return {j: job for j, job in jobs.items() if job is not None and job.name == "gpupool-server"}


def held_outside(hub) -> dict[str, list[int]]:
    r = hub.service("GET", "/pool", hub.tester_token)
    r.raise_for_status()
    return {n["node"]: n["held_outside"] for n in r.json()["nodes"] if n.get("held_outside")}


def alloc_of(hub, user: str) -> dict:
    [alloc] = [a for a in allocations(hub) if a["user"] == user]
    return alloc


def test_shard_share_spawns_with_shards_on_the_gpu_slurm_gave(shard_hub, shard_slurm_cluster, unix_account):
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    user = unix_account("sharda")
    set_balance(hub, user, "100")
    try:
        ok, message = wait_spawned(hub, user, "", spawn(hub, user, {"profile": "half-a6000"}))
        assert ok, f"did not start: {message}\n{hub.log_tail(40)}"
        [(job_id, job)] = server_jobs(cluster).items()
        raw = cluster.run(["scontrol", "--details", "show", "job", "--oneliner", str(job_id)]).stdout
        assert "TresPerNode=gres:shard:a6000:4" in raw and "gres:gpu" not in raw, raw
        assert job.gpu_indices("sgpu-a") == () and len(job.shard_indices("sgpu-a")) == 1, raw
        [given] = job.shard_indices("sgpu-a")
        alloc = alloc_of(hub, user)
        assert alloc["node"] == "sgpu-a"
        assert [(g["index"], Decimal(g["fraction"])) for g in alloc["gpus"]] == [(given, HALF_GPU)], alloc
        wait_for(lambda: not held_outside(hub), 30, "nothing held outside the hub")
        gpus = pool_gpus(hub)["sgpu-a"]
        assert [h["allocation"] for h in gpus[given]["holders"]] == [alloc["id"]], gpus
    finally:
        stop_server(hub, user)
        wait_for(lambda: not allocations(hub), 30, "the allocation to be released")
        cluster.reset()


def test_shard_shares_pack_one_gpu_and_never_book_past_it(shard_hub, shard_slurm_cluster, unix_account):
    """Two halves, then a whole GPU, then a third half: Slurm and the pool agree on every GPU, the
    fourth request finds no room in the pool (nothing is submitted), and nothing is held outside."""
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    users = [unix_account(f"shard{c}") for c in "bcde"]
    for u in users:
        set_balance(hub, u, "100")
    try:
        for u, profile in zip(users[:3], ["half-a6000", "half-a6000", "a6000"]):
            ok, message = wait_spawned(hub, u, "", spawn(hub, u, {"profile": profile}))
            assert ok, f"{u} did not start: {message}\n{hub.log_tail(40)}"
        jobs = server_jobs(cluster)
        assert len(jobs) == 3
        slurm_gpus = sorted((job.shard_indices("sgpu-a"), job.gpu_indices("sgpu-a")) for job in jobs.values())
        pool = {u: [(g["index"], Decimal(g["fraction"])) for g in alloc_of(hub, u)["gpus"]] for u in users[:3]}
        # both halves on one GPU, the whole GPU on the other, in Slurm and in the pool alike
        half_gpu = pool[users[0]][0][0]
        assert pool[users[1]] == [(half_gpu, HALF_GPU)] and pool[users[0]] == [(half_gpu, HALF_GPU)], pool
        assert pool[users[2]] == [(1 - half_gpu, 1)], pool
        assert slurm_gpus == [((), (1 - half_gpu,)), ((half_gpu,), ()), ((half_gpu,), ())], slurm_gpus
        wait_for(lambda: not held_outside(hub), 30, "nothing held outside the hub")
        # charged as held: a half costs half a whole A6000
        whole = Decimal(alloc_of(hub, users[2])["price_per_hour"])
        assert Decimal(alloc_of(hub, users[0])["price_per_hour"]) * 2 == whole
        # no room left: refused by the pool (or queued), never a third share on a full GPU
        before = set(server_jobs(cluster))
        r = spawn(hub, users[3], {"profile": "half-a6000"})
        ok, message = wait_spawned(hub, users[3], "", r) if r.status_code < 400 else (False, r.text)
        assert not ok, message
        assert set(server_jobs(cluster)) == before
    finally:
        for u in users:
            stop_server(hub, u)
        wait_for(lambda: not allocations(hub), 30, "the allocations to be released")
        cluster.reset()


def job_of(cluster, alloc_id: str):
    """The hub job of an allocation, by its comment (the spawner's ``gpupool-allocation=<id>``)."""
    [job] = [j for j in server_jobs(cluster).values() if j.comment == f"gpupool-allocation={alloc_id}"]
    return job


def agree(hub, cluster, users) -> bool:
    """Whether every user's allocation names the GPU its job was really given (a share: whose shards)."""
    for u in users:
        alloc = alloc_of(hub, u)
        job = job_of(cluster, alloc["id"])
        slurm = job.shard_indices("sgpu-a") or job.gpu_indices("sgpu-a")
        if sorted(g["index"] for g in alloc["gpus"]) != list(slurm):
            return False
    return True


def test_48_3_a_half_and_a_whole_gpu_asked_for_at_once_agree_in_pool_and_slurm(shard_hub, shard_slurm_cluster,
                                                                                unix_account):
    """Issue 48.3: a half and a whole GPU asked for at nearly the same moment: Slurm gave them opposite GPUs,
    the pool's fix-up was refused (409), never retried, and the whole-GPU job waited while charged. Both
    spawns at once end with the pool booking what Slurm bound, each charged from its job's start."""
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    half, whole = unix_account("conch"), unix_account("concw")
    for u in (half, whole):
        set_balance(hub, u, "100")
    try:
        responses = {}
        threads = [threading.Thread(target=lambda u=u, p=p: responses.__setitem__(u, spawn(hub, u, {"profile": p})))
                   for u, p in ((half, "half-a6000"), (whole, "a6000"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for u in (half, whole):
            ok, message = wait_spawned(hub, u, "", responses[u])
            assert ok, f"{u} did not start: {message}\n{hub.log_tail(40)}"
        wait_for(lambda: agree(hub, cluster, (half, whole)), 60, "the pool to book what Slurm bound")
        for u in (half, whole):
            alloc = alloc_of(hub, u)
            started = job_of(cluster, alloc["id"]).start_time
            assert alloc["charged_from"] is not None and started is not None
            assert abs(datetime.fromisoformat(alloc["charged_from"].replace("Z", "+00:00")) - started) <= \
                timedelta(seconds=1), (alloc, started)
        wait_for(lambda: not held_outside(hub), 30, "nothing held outside the hub")
    finally:
        for u in (half, whole):
            stop_server(hub, u)
        wait_for(lambda: not allocations(hub), 30, "the allocations to be released")
        cluster.reset()


def test_48_3_opposite_gpus_in_slurm_swap_the_bookings(shard_hub, shard_slurm_cluster):
    """The swap itself, made certain: the pool books a half and a whole GPU, then real jobs are submitted in
    the order that makes Slurm bind them the other way round, and each allocation is told its job's GPUs as
    the spawner tells it. The first answer swaps both bookings (before: 409 naming the mover as holder)."""
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    posted = {}
    for user, request in (("swaph", {"gpu_fraction": 0.5, "models": ["RTX A6000"]}),
                          ("swapw", {"gpus": 1, "models": ["RTX A6000"]})):
        hub.service("POST", f"/users/{user}/grant", hub.tester_token, json={"amount": "100", "reason": "test"})
        r = hub.service("POST", "/allocations", hub.spawner_token,  # as the Slurm spawner asks: pending
                        json={"user": user, "request": request, "pending": True})
        assert r.status_code == 201, r.text
        posted[user] = r.json()["allocation"]
    h = posted["swaph"]["gpus"][0]["index"]
    assert posted["swapw"]["gpus"][0]["index"] == 1 - h
    jobs = []
    try:
        # Slurm gives the first GPU with room: submitted in this order, the whole lands on h, the half on 1 - h
        order = [("swapw", "gpu:a6000:1"), ("swaph", f"shard:a6000:{SHARDS // 2}")]
        for user, gres in (order if h == 0 else order[::-1]):
            jobs.append((user, cluster.submit(gres=gres, node="sgpu-a", name="gpupool-server")))
        inventory = SlurmInventory(MODELS, env=cluster.env)
        bound = {u: inventory.job(j) for u, j in jobs}
        assert bound["swapw"].gpu_indices("sgpu-a") == (h,) and bound["swaph"].shard_indices("sgpu-a") == (1 - h,)
        r = hub.service("PATCH", f"/allocations/{posted['swaph']['id']}", hub.spawner_token,
                        json={"gpu_indices": [1 - h]})
        assert r.status_code == 200, r.text
        now = {a["id"]: [g["index"] for g in a["gpus"]] for a in allocations(hub)}
        assert now == {posted["swaph"]["id"]: [1 - h], posted["swapw"]["id"]: [h]}
        # the whole GPU's own report then agrees already: nothing moves
        r = hub.service("PATCH", f"/allocations/{posted['swapw']['id']}", hub.spawner_token, json={"gpu_indices": [h]})
        assert r.status_code == 200 and [g["index"] for g in r.json()["allocation"]["gpus"]] == [h]
    finally:
        cluster.cancel(*(j for _, j in jobs))
        for a in posted.values():
            hub.service("DELETE", f"/allocations/{a['id']}", hub.spawner_token)
        cluster.reset()


def test_48_3_nothing_is_charged_while_the_job_is_pending_in_slurm(shard_hub, shard_slurm_cluster, unix_account):
    """A whole-GPU job that Slurm keeps pending (its partition down) holds its GPU in the pool but costs
    nothing until it runs; then it is charged from its StartTime."""
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    user = unix_account("pendw")
    set_balance(hub, user, "100")
    cluster.run(["scontrol", "update", "PartitionName=gpu", "State=DOWN"])
    try:
        r = spawn(hub, user, {"profile": "a6000"})
        assert r.status_code == 202, r.text
        wait_for(lambda: [a for a in allocations(hub) if a["user"] == user] and server_jobs(cluster), 60,
                 "the allocation and its job")
        [job] = server_jobs(cluster).values()
        assert job.state == "PENDING", job
        alloc = alloc_of(hub, user)
        assert alloc["charged_from"] is None  # held, not charged
        cluster.run(["scontrol", "update", "PartitionName=gpu", "State=UP"])
        ok, message = wait_spawned(hub, user, "", r)
        assert ok, message
        alloc = alloc_of(hub, user)
        started = job_of(cluster, alloc["id"]).start_time
        assert alloc["charged_from"] is not None and started is not None
        assert datetime.fromisoformat(alloc["charged_from"].replace("Z", "+00:00")) >= started - timedelta(seconds=1)
        assert started > datetime.fromisoformat(alloc["started_at"].replace("Z", "+00:00"))
    finally:
        cluster.run(["scontrol", "update", "PartitionName=gpu", "State=UP"])
        stop_server(hub, user)
        wait_for(lambda: not allocations(hub), 30, "the allocation to be released")
        cluster.reset()


def node_problem(hub, node: str) -> str:
    r = hub.service("GET", "/pool", hub.tester_token)
    r.raise_for_status()
    return next((n.get("problem") or "" for n in r.json()["nodes"] if n["node"] == node), "")


def test_48_4_slurm_2205_gives_a_gpu_whole_while_its_shards_are_held_and_the_service_sees_it(
        shard_hub, shard_slurm_cluster):
    """Issue 48.4, with plain sbatch: two shard jobs share a GPU; when one ends, Slurm 22.05.8 forgets the
    other's shards (GresUsed shard:a6000:0) and gives that GPU whole to the next job. The service sees it
    within one refresh, says so once in its log and on the pool map."""
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    inventory = SlurmInventory(MODELS, env=cluster.env)
    try:
        a = cluster.submit(gres=f"shard:a6000:{SHARDS // 2}", node="sgpu-a", name="A")
        b = cluster.submit(gres=f"shard:a6000:{SHARDS // 2}", node="sgpu-a", name="B")
        [gpu] = inventory.job(b).shard_indices("sgpu-a")
        assert inventory.job(a).shard_indices("sgpu-a") == (gpu,)
        other = cluster.submit(gres="gpu:a6000:1", node="sgpu-a", name="X")  # the other GPU, whole
        assert inventory.job(other).gpu_indices("sgpu-a") == (1 - gpu,)
        cluster.cancel(a)
        cluster.wait_job_done(a)
        used = cluster.run(["scontrol", "-d", "show", "node", "-o", "sgpu-a"]).stdout
        assert "shard:a6000:0(IDX:N/A)" in used, used  # B's shards forgotten
        w = cluster.submit(gres="gpu:a6000:1", node="sgpu-a", name="W")  # Slurm's bug: it runs, on B's GPU
        assert inventory.job(w).gpu_indices("sgpu-a") == (gpu,) and inventory.job(b).shard_indices("sgpu-a") == (gpu,)
        said = f"GPU {gpu} was given whole to Slurm job {w} while job {b} holds shards of it"
        wait_for(lambda: said in node_problem(hub, "sgpu-a"), 30, "the pool map to say so")
        warning = f"Node sgpu-a: {said}"
        wait_for(lambda: warning in hub.log_tail(4000), 30, "the service's warning")
        seen = inventory_refreshes(hub)
        wait_for(lambda: inventory_refreshes(hub) >= seen + 3, 60, "three more inventory refreshes")
        assert hub.log_tail(8000).count(warning) == 1  # said once, not at every refresh
    finally:
        cluster.reset()
    wait_for(lambda: not node_problem(hub, "sgpu-a"), 30, "the problem to clear once the jobs are gone")


def test_48_4_a_whole_gpu_server_put_on_a_shared_gpu_is_charged_only_what_is_left(shard_hub, shard_slurm_cluster,
                                                                                   unix_account):
    """Through the hub: two halves share GPU 0; one stops, Slurm forgets the other's shards, and the next
    whole-GPU server (the pool booked GPU 1) is given GPU 0 by Slurm. The pool books it where Slurm put it,
    as the half that is left, and charges it that; the half-share user keeps its booking."""
    cluster, hub = shard_slurm_cluster, shard_hub
    cluster.reset()
    h1, h2, w = unix_account("lost1"), unix_account("lost2"), unix_account("lostw")
    for u in (h1, h2, w):
        set_balance(hub, u, "100")
    try:
        for u in (h1, h2):
            ok, message = wait_spawned(hub, u, "", spawn(hub, u, {"profile": "half-a6000"}))
            assert ok, message
        g = alloc_of(hub, h2)["gpus"][0]["index"]
        assert g == 0 and alloc_of(hub, h1)["gpus"][0]["index"] == 0  # Slurm's first GPU with room
        stop_server(hub, h1)
        wait_for(lambda: all(a["user"] != h1 for a in allocations(hub)), 60, "the first half to be released")
        ok, message = wait_spawned(hub, w, "", spawn(hub, w, {"profile": "a6000"}))
        assert ok, message
        assert job_of(cluster, alloc_of(hub, w)["id"]).gpu_indices("sgpu-a") == (0,)  # Slurm's bug
        wait_for(lambda: [(g["index"], Decimal(g["fraction"])) for g in alloc_of(hub, w)["gpus"]] == [(0, HALF_GPU)],
                 60, "the whole-GPU server to be booked and charged as the half that is left")
        assert [(g["index"], Decimal(g["fraction"])) for g in alloc_of(hub, h2)["gpus"]] == [(0, HALF_GPU)]
        assert "was given whole to Slurm job" in node_problem(hub, "sgpu-a")
    finally:
        for u in (h1, h2, w):
            stop_server(hub, u)
        wait_for(lambda: not allocations(hub), 60, "the allocations to be released")
        cluster.reset()


@pytest.fixture(scope="module")
def queue_hub(tmp_path_factory, shard_slurm_cluster):
    """A second hub on the confined shard cluster, with the wait queue on (the example configuration's)."""
    workdir = tmp_path_factory.mktemp("shardqueue")
    config = (slurm_config(workdir, shard_slurm_cluster) + f"c.GPUPoolSpawner.profiles = {SHARE_PROFILES!r}\n"
              + "c.GPUPool.slurm_allow_env_only_gpu_hiding = False\nc.GPUPool.queue_enabled = True\n")
    yield from spawner_hub(tmp_path_factory, "shardqueue", config)


def queue_entries(hub) -> list[dict]:
    r = hub.service("GET", "/queue", hub.tester_token)
    r.raise_for_status()
    return r.json()["waiting"]
def job_alive(job_id: int) -> bool:
    """Whether a process of Slurm job ``job_id`` still runs on this machine (the cluster's nodes are here)."""
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (proc / "environ").read_bytes():
                return True
        except OSError:
            continue
    return False


def test_48_2_a_stop_while_slurmctld_is_down_keeps_the_gpu_held_and_charged_until_the_job_ends(
        queue_hub, shard_slurm_cluster, unix_account):
    """Issue 48.2: with slurmctld down, DELETE of the server answered, scancel failed, and the pool released the
    GPU all the same: the job ran on 14 minutes uncharged while the next user got its GPU. Now the allocation
    stays held and charged, shown as stopping; the cancel is asked again once slurmctld answers, and the
    waiting user gets that GPU only when the job is gone."""
    hub, slurm = queue_hub, shard_slurm_cluster
    slurm.reset()
    owner, waiter = unix_account("stopa"), unix_account("stopb")
    for user in (owner, waiter):
        set_balance(hub, user, "100")
    ok, message = wait_spawned(hub, owner, "", spawn(hub, owner, {"profile": "a6000"}))
    assert ok, message
    [alloc] = allocations(hub)
    [job] = [j for j in server_jobs(slurm)]
    slurm.stop_slurmctld()
    try:
        stop_server(hub, owner, timeout=120)  # the hub counts it stopped: its scancel failed
        assert job_alive(job)  # the job runs on
        [held] = allocations(hub)
        assert held["id"] == alloc["id"] and held["released_at"] is None  # held, and so charged
        wait_for(lambda: allocations(hub)[0]["stopping_since"], 30, "the service to be told it is stopping")
        r = spawn(hub, waiter, {"profile": "a6000", "gpus": 2})  # both A6000s: the owner's GPU is needed
        assert r.status_code == 202, r.text
        wait_for(lambda: [e["user"] for e in queue_entries(hub)] == [waiter], 30, "the waiter to queue")
        assert [a["user"] for a in allocations(hub)] == [owner]  # the GPU is not the waiter's
        assert job_alive(job)
    finally:
        slurm.start_slurmctld()
    back = datetime.now(timezone.utc)
    # slurmctld answers: the hub asks again, the job is cancelled, then the GPU goes to the waiter
    wait_for(lambda: not job_alive(job) and job not in slurm.job_ids(), 90, "the job to be cancelled at last")
    wait_for(lambda: all(a["id"] != alloc["id"] for a in allocations(hub)), 60, "the GPU to be released")
    ok, message = wait_spawned(hub, waiter, "", r)
    assert ok, message
    released = hub.service("GET", f"/allocations/{alloc['id']}", hub.spawner_token).json()["allocation"]
    assert datetime.fromisoformat(released["released_at"].replace("Z", "+00:00")) >= back - timedelta(seconds=1), \
        released  # charged until the job was seen gone, not until the failed stop
    [new] = allocations(hub)
    assert new["user"] == waiter and alloc["gpus"][0]["index"] in [g["index"] for g in new["gpus"]]
    stop_server(hub, waiter)
    wait_for(lambda: not allocations(hub), 60, "the waiter's allocation to be released")
    slurm.reset()


def test_48_9_the_example_slurm_block_starts_as_shipped_and_names_profiles_no_node_fits(
        shard_slurm_cluster, tmp_path):
    """Issue 48.9: the example configuration's Slurm block, uncommented as docs/slurm.md says (only its CHANGE
    lines given this site's values), did not start: its usage_preset "slurm" was refused beside the example's
    own half-a6000 profile. It starts now, on a cluster with shards and ConstrainDevices=yes, and says once
    which of the example's profiles no node can take (1xa6000 asks 32 GB, half-a6000 16 GiB; these nodes
    have 16,000 MiB)."""
    from tests.e2e.conftest import ExampleHub, shut_down
    from tests.slurm.test_docs_verbatim import slurm_block

    cluster = shard_slurm_cluster
    lines, changes = slurm_block()
    site = {"SERVERS_PYTHON": repr(str(Path(sys.executable).parent)), "c.JupyterHub.hub_connect_ip": repr("127.0.0.1"),
            "c.GPUPool.slurm_conf": repr(str(cluster.conf)), "c.GPUPool.slurm_gpu_models": repr(MODELS),
            "c.GPUPoolSlurmSpawner.node_addresses": json.dumps({n.name: "127.0.0.1" for n in cluster.nodes})}
    assert set(site) == changes
    block = "\n".join(f"{line.split(' = ', 1)[0]} = {site[line.split(' = ', 1)[0]]}"
                      if line.split(" = ", 1)[0] in site else line for line in lines)
    workdir = tmp_path / "examplehub"
    workdir.mkdir()
    hub = ExampleHub(workdir, debit_interval=5, debit_check_interval=1, extra=block + "\n")
    try:
        hub.start(timeout=90)  # the hub starts only once its service did
        log = hub.log_path.read_text()
        assert "gpupool-slurm" in log or "GPUPoolSlurmSpawner" in log
        assert log.count("no node of the pool can ever take profile(s)") == 1, log[-3000:]
        said = log.split("can ever take profile(s)")[1].split("\n")[0]
        assert "'1xa6000' (1 GPU (nvidia rtx a6000), 8 CPU, 32768 MiB)" in said, said  # 16,000 MiB nodes
        assert "'half-a6000'" in said and "3090" not in said, said  # a model the pool lacks is another matter
    finally:
        shut_down(hub)


def test_shard_start_check_refuses_fractional_profiles_without_shards(slurm_cluster, shard_slurm_cluster, tmp_path):
    config = f"""
        c.JupyterHub.spawner_class = "gpupool-slurm"
        c.GPUPoolService.spawner_token = "shard-test-spawner-token-0123456789abcdef"
        c.GPUPool.inventory = "slurm"
        c.GPUPool.slurm_gpu_models = {MODELS!r}
        c.GPUPool.slurm_conf = {str(shard_slurm_cluster.conf)!r}
        c.GPUPool.slurm_allow_env_only_gpu_hiding = True
        c.GPUPool.default_price = 1
        c.GPUPoolSpawner.profiles = {SHARE_PROFILES!r}
    """
    start(tmp_path, config)  # shards configured: starts
    plain = config.replace(str(shard_slurm_cluster.conf), str(slurm_cluster.conf))
    (tmp_path / "plain").mkdir()
    with pytest.raises(SystemExit) as e:
        start(tmp_path / "plain", plain)
    message = str(e.value)
    assert "profile 'half-a6000'" in message, message
    assert "GresTypes=gpu,shard" in message and "Gres=gpu:a6000:4,shard:a6000:8" in message, message
    assert "NodeName=gpu-a Name=shard Type=a6000 Count=2" in message, message
    # sacct charges gres/gpu only: charging shares from it would charge nothing, so that is refused too
    (tmp_path / "sacct").mkdir()
    with pytest.raises(SystemExit) as e:
        start(tmp_path / "sacct", config.rstrip() + '\n        c.GPUPoolService.usage_preset = "slurm"\n')
    assert "'half-a6000'" in str(e.value) and "usage_preset" in str(e.value) and "charged nothing" in str(e.value)
    # without fractional profiles the plain cluster is fine
    (tmp_path / "whole").mkdir()
    start(tmp_path / "whole", plain.replace(f"c.GPUPoolSpawner.profiles = {SHARE_PROFILES!r}",
                                            f"c.GPUPoolSpawner.profiles = {PROFILES!r}"))


# --------------------------------------------------------------- without a cluster

#: what Slurm 22.05 printed on the shard cluster (scontrol -d show job -o / show node -o, cut)
SHARD_JOB = ("JobId=8 JobName=wrap UserId=root(0) JobState=RUNNING Reason=None NodeList=sgpu-a "
             "JOB_GRES=shard:a6000:2   Nodes=sgpu-a CPU_IDs=1 GRES=shard:a6000:2(IDX:1) MinCPUsNode=1 "
             "TresPerNode=gres:shard:a6000:2")


def test_shard_job_gres_names_the_gpu_whose_shards_it_holds():
    from gpupool_hub.engines.slurm.parse import parse_job

    job = parse_job(SHARD_JOB)
    assert job.shard_indices("sgpu-a") == (1,) and job.gpu_indices("sgpu-a") == ()
    assert job.shards == {"sgpu-a": {"a6000": ((1,), 2)}}


def test_shard_counts_per_gpu_and_shard_use_marks_gpus_busy():
    from gpupool_hub.engines.slurm.scontrol_nodes import parse_nodes, shards_per_gpu

    assert shards_per_gpu("gpu:a6000:2,shard:a6000:16") == {"a6000": 8}
    assert shards_per_gpu("gpu:a6000:2(S:0-1),gpu:rtx3090:1,shard:a6000:8(S:0-1)") == {"a6000": 4}
    assert shards_per_gpu("gpu:a6000:2,shard:a6000:3") == {}  # uneven: left out, the start check names it
    line = ("NodeName=sgpu-a CPUTot=8 RealMemory=16000 State=MIXED Partitions=gpu "
            "Gres=gpu:a6000:2,shard:a6000:16 GresUsed=gpu:a6000:0(IDX:N/A),shard:a6000:1(IDX:1)")
    (node,) = parse_nodes(line, MODELS)
    assert node.shards_per_gpu == {"a6000": 8} and node.gpus_in_use == {1}


def test_shard_request_is_a_whole_number_of_shards():
    from gpupool_hub.engines.slurm.spawner import shard_request
    from gpupool_hub.spawner.errors import GPUPoolRefused

    assert shard_request("sgpu-a", "a6000", 500, 8) == "shard:a6000:4"
    assert shard_request("sgpu-a", "a6000", 250, 8) == "shard:a6000:2"
    with pytest.raises(GPUPoolRefused, match="has no shards"):
        shard_request("gpu-a", "a6000", 500, 0)
    with pytest.raises(GPUPoolRefused, match="not a whole number"):
        shard_request("gpu-a", "a6000", 300, 8)


def test_shard_problems_name_the_profile_and_the_lines():
    from gpupool_hub.profiles import parse_profiles
    from gpupool_hub.engines.slurm.scontrol_nodes import parse_nodes
    from gpupool_hub.engines.slurm.shares import share_problems

    profiles = parse_profiles([HALF, {"slug": "tenth", "display_name": "A tenth", "gpu_fraction": 0.1}])
    plain = parse_nodes("NodeName=gpu-a CPUTot=8 RealMemory=16000 State=IDLE Gres=gpu:a6000:4 "
                        "GresUsed=gpu:a6000:0(IDX:N/A)", MODELS)
    problems = share_problems(profiles, plain, MODELS)
    assert len(problems) == 2 and "profile 'half-a6000'" in problems[0] and "profile 'tenth'" in problems[1]
    # one shard count for every profile: 10 per GPU fits both 0.5 and 0.1
    assert "Gres=gpu:a6000:4,shard:a6000:40" in problems[0] and "Count=10" in problems[0]
    uneven = parse_nodes("NodeName=gpu-a CPUTot=8 RealMemory=16000 State=IDLE Gres=gpu:a6000:4,shard:a6000:16 "
                         "GresUsed=gpu:a6000:0(IDX:N/A)", MODELS)
    assert share_problems(profiles[:1], uneven, MODELS) == []
    [problem] = share_problems(profiles, uneven, MODELS)
    assert "'tenth'" in problem and "not a whole number of shards" in problem and "multiple of 10" in problem
    assert share_problems(parse_profiles(PROFILES[:3]), plain, MODELS) == []  # no shares: nothing to check


def test_shard_rebind_moves_the_share_and_its_price_stays_the_share_held(tmp_path):
    """The spawner's PATCH after Slurm chose the GPU: the share moves with its size and class, the
    other GPU keeps its room, and the price per hour is the share's (half an A6000: 2 of 4)."""
    from gpupool_hub.placement import Request
    from tests.fixtures.manager import make_manager

    node = {"name": "sgpu-a", "cpu_milli": 8000, "memory_mib": 16000,
            "gpus": [{"index": i, "uuid": f"sgpu-a/gpu{i}", "model": "NVIDIA RTX A6000"} for i in (0, 1)]}
    m = make_manager([node], {"RTX A6000": 4}, f"sqlite:///{tmp_path}/ledger.sqlite")
    first = m.admission.admit("u1", [], "", Request(gpu_milli=500), ["RTX A6000"])
    [g] = first.gpus
    other = 1 - g["index"]
    moved = m.rebinds.rebind(m.ledger, first.id, [other])
    assert [(x["index"], x["milli"], x["uuid"]) for x in moved.gpus] == [(other, 500, f"sgpu-a/gpu{other}")]
    assert {k: v for k, v in moved.gpus[0].items() if k not in ("index", "uuid")} == \
        {k: v for k, v in g.items() if k not in ("index", "uuid")}
    assert moved.price_per_hour == Decimal(2)
    # a whole GPU and another half still fit: the moved share left its first GPU free
    whole = m.admission.admit("u2", [], "", Request(gpus=1), ["RTX A6000"])
    assert [x["index"] for x in whole.gpus] == [g["index"]]
    second = m.admission.admit("u3", [], "", Request(gpu_milli=500), ["RTX A6000"])
    assert [x["index"] for x in second.gpus] == [other]
    # Slurm never gives a full GPU's shards; the refusal names the holder (issue 48.3: it named the mover)
    with pytest.raises(ValueError, match=f"held by {whole.id}: swapping the bookings fails"):
        m.rebinds.rebind(m.ledger, second.id, [g["index"]])
    assert [x["index"] for x in m.ledger.allocations.get(second.id).gpus] == [other]
