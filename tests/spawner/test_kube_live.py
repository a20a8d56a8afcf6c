"""Issue 40.4: GPUPoolKubeSpawner's real ``start``, ``poll`` and ``stop``, on the wire.

No API server can be installed here, so ``kube_standin.py`` answers the calls
KubeSpawner's ``kubernetes_asyncio`` client makes (the pod and event reflectors'
list and watch, pod create, delete) on 127.0.0.1 and keeps each request body.
KubeSpawner finds it as it finds a cluster: through a kubeconfig file
(``KUBECONFIG``). The pool is the real gpupool service (in-process, SQLite; one
node ``n1`` with two A100s), asked over HTTP by the spawner's own client.

What is checked is the pod as sent: the required node affinity to the node the
pool chose, the GPU resource limit (``nvidia.com/gpu`` for whole GPUs, the
shared or MIG resource for a fraction), ``NVIDIA_VISIBLE_DEVICES=void`` on a
CPU-only pod; and the allocation's life: released when the pod is gone (poll),
when the server stops (a ``DELETE`` sent), and never charged when the API server
refuses the pod.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpupool_hub.spawner.errors import GPUPoolRefused, SpawnFailure
from tests.agent.test_service import Service
from tests.spawner.kube_standin import POD_IP, KubeStandIn

pytest.importorskip("kubespawner")

from kubernetes_asyncio.config import kube_config  # noqa: E402

from gpupool_hub.engines.kubernetes.spawner import GPUPoolKubeSpawner  # noqa: E402

NAMESPACE = "jhub"
PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "default": True},
    {"slug": "2gpu", "display_name": "2 GPUs", "gpus": 2},
    {"slug": "1gpu", "display_name": "1 GPU", "gpus": 1},
    {"slug": "quarter", "display_name": "1/4 GPU", "gpu_fraction": 0.25},
    {"slug": "half", "display_name": "1/2 GPU", "gpu_fraction": 0.5},
]


@pytest.fixture
async def cluster(tmp_path, monkeypatch):
    """The API stand-in, found through a kubeconfig; every reflector stopped afterwards."""
    standin = KubeStandIn().start()
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps(standin.kubeconfig()))  # YAML reads JSON
    monkeypatch.setenv("KUBECONFIG", str(config))
    # kubernetes_asyncio reads KUBECONFIG once, when imported (a hub sets it before it starts)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a cluster: read the kubeconfig
    try:
        yield standin
    finally:
        await GPUPoolKubeSpawner._stop_all_reflectors()
        standin.stop()
        assert standin.unknown == [], f"KubeSpawner called what the stand-in does not serve: {standin.unknown}"


@pytest.fixture
async def pool(tmp_path):
    svc = Service(tmp_path)
    yield svc
    svc.stop()


def make_spawner(cluster: KubeStandIn, svc: Service, profile: str, **traits) -> GPUPoolKubeSpawner:
    c = Config()
    c.GPUPoolSpawner.profiles = PROFILES
    c.GPUPoolSpawner.gpupool_api_url = svc.url + "api/v1"
    c.GPUPoolSpawner.gpupool_api_token = "admin-token"
    c.KubeSpawner.k8s_api_host = cluster.url
    c.KubeSpawner.namespace = NAMESPACE
    c.KubeSpawner.start_timeout = 20
    c.KubeSpawner.k8s_api_request_retry_timeout = 5
    c.KubeSpawner.delete_grace_period = 0
    for name, value in traits.items():
        setattr(c.GPUPoolKubeSpawner, name, value)
    user = SimpleNamespace(name="kim", id=9, url="/user/kim/", escaped_name="kim", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/",
                          url="http://127.0.0.1:8081/hub/", public_host="", host="")
    spawner = GPUPoolKubeSpawner(user=user, hub=hub, config=c)
    spawner.user_options = {"profile": profile}
    return spawner


def held(svc: Service) -> list:
    return svc.manager.ledger.allocations.overlapping(datetime(2000, 1, 1, tzinfo=timezone.utc),
                                                      datetime(2100, 1, 1, tzinfo=timezone.utc))


def notebook(pod: dict) -> dict:
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    return container


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in notebook(pod).get("env", [])}


def node_terms(pod: dict) -> list[dict]:
    return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


async def eventually(check, timeout: float = 10, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def paths(cluster: KubeStandIn) -> set[str]:
    """Each call as 'METHOD path', watches marked: what KubeSpawner asked the API for."""
    return {f"{m} {p}{' (watch)' if q.get('watch') else ''}" for m, p, q, _ in cluster.requests}


async def test_a_gpu_pod_is_sent_pinned_to_the_pools_node_with_its_gpus_and_stop_deletes_it(cluster, pool):
    spawner = make_spawner(cluster, pool, "2gpu", node_affinity_required=[
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}])
    url = await spawner.start()
    assert url == f"http://{POD_IP}:8888"
    [alloc] = held(pool)
    assert alloc.user == "kim" and alloc.released_at is None and len(alloc.gpus) == 2
    [pod] = cluster.created
    # the node the pool chose is required, ANDed into the admin's own term
    [term] = node_terms(pod)
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": [alloc.node]} in term["matchExpressions"]
    assert {"key": "gpu", "operator": "Exists"} in term["matchExpressions"]
    resources = notebook(pod)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "2" and resources["requests"]["nvidia.com/gpu"] == "2"
    env = env_of(pod)
    assert env["GPUPOOL_ALLOCATION"] == alloc.id and env["GPUPOOL_NODE"] == alloc.node
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "CUDA_VISIBLE_DEVICES" not in env  # the device plugin's

    assert await spawner.poll() is None  # running: nothing released
    assert held(pool)[0].released_at is None

    await spawner.stop()
    assert cluster.deleted == [spawner.pod_name]
    [alloc] = held(pool)
    assert alloc.released_at is not None and alloc.release_reason == "server stopped"
    assert paths(cluster) == {
        f"GET /api/v1/namespaces/{NAMESPACE}/pods", f"GET /api/v1/namespaces/{NAMESPACE}/pods (watch)",
        f"GET /api/v1/namespaces/{NAMESPACE}/events", f"GET /api/v1/namespaces/{NAMESPACE}/events (watch)",
        f"POST /api/v1/namespaces/{NAMESPACE}/pods", f"DELETE /api/v1/namespaces/{NAMESPACE}/pods/{spawner.pod_name}",
    }, sorted(paths(cluster))


async def test_a_cpu_only_pod_gets_no_gpu_and_void_visible_devices(cluster, pool):
    spawner = make_spawner(cluster, pool, "cpu")
    await spawner.start()
    [pod] = cluster.created
    assert env_of(pod)["NVIDIA_VISIBLE_DEVICES"] == "void" and "GPUPOOL_ALLOCATION" not in env_of(pod)
    resources = notebook(pod).get("resources") or {}
    assert not any(k.startswith("nvidia.com/") for part in resources.values() for k in (part or {})), resources
    assert "affinity" not in pod["spec"] or not pod["spec"]["affinity"].get("nodeAffinity")
    assert held(pool) == []
    await spawner.stop()
    assert cluster.deleted == [spawner.pod_name]


@pytest.mark.parametrize("profile, traits, resource", [
    ("quarter", {}, "nvidia.com/gpu.shared"),  # a time-sliced GPU (renameByDefault)
    ("half", {"gpu_fraction_resources": {"0.5": {"nvidia.com/mig-3g.40gb": 1}}}, "nvidia.com/mig-3g.40gb"),
])
async def test_a_fraction_sends_the_shared_or_mig_resource(cluster, pool, profile, traits, resource):
    spawner = make_spawner(cluster, pool, profile, **traits)
    await spawner.start()
    [alloc] = held(pool)
    [pod] = cluster.created
    limits = notebook(pod)["resources"]["limits"]
    assert limits[resource] == "1" and "nvidia.com/gpu" not in limits, limits
    assert node_terms(pod) == [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [alloc.node]}]}]
    await spawner.stop()
    assert held(pool)[0].released_at is not None


async def test_a_pod_gone_from_the_cluster_is_an_exit_and_its_gpus_go_back(cluster, pool):
    spawner = make_spawner(cluster, pool, "1gpu")
    await spawner.start()
    assert await spawner.poll() is None
    cluster.end_pod(NAMESPACE, spawner.pod_name)  # evicted, or deleted by someone else
    await eventually(lambda: f"{NAMESPACE}/{spawner.pod_name}" not in spawner.pod_reflector.pods, what="the watch")
    assert await spawner.poll() == 1
    [alloc] = held(pool)
    assert alloc.released_at is not None and alloc.release_reason == "server gone (exit status 1)"


@pytest.mark.parametrize("code, reason, message", [
    (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:jhub:hub" cannot create resource "pods"'),
    (422, "Invalid", 'Pod "jupyter-kim" is invalid: spec.containers[0].resources.limits[nvidia.com/gpu]: '
                     'Invalid value: "2": must be equal to request'),
])
async def test_a_pod_the_api_refuses_fails_the_spawn_clearly_and_is_never_charged(cluster, pool, code, reason,
                                                                                  message):
    cluster.refuse = (code, reason, message)
    spawner = make_spawner(cluster, pool, "1gpu")
    with pytest.raises(GPUPoolRefused) as e:
        await spawner.start()
    assert e.value.reason == SpawnFailure.CLUSTER_REFUSED and e.value.status_code == 500
    assert e.value.message.startswith(f"Kubernetes refused the pod ({code} ") and message in e.value.message
    assert len(cluster.created) == 1  # asked once: a refusal is not retried
    await eventually(lambda: held(pool) and held(pool)[0].released_at is not None, what="the release")
    [alloc] = held(pool)
    assert alloc.released_at == alloc.created_at, alloc  # never charged
    assert "abandoned" in alloc.release_reason
