"""GPUPoolKubeSpawner: KubeSpawner with gpupool profiles (``pip install gpupool_hub[kubernetes]``).

The gpupool service chooses the node; the pod gets

* a *required* node affinity to that node (``kubernetes.io/hostname`` In
  [node], or the label in ``gpupool_node_label``), added to every
  node-selector term the admin configured (terms are ORed by Kubernetes,
  expressions inside a term ANDed, so the node is required in each);
* the GPU resource limit: ``nvidia.com/gpu: N`` for whole GPUs; for a
  fraction, the resource in ``gpu_fraction_resources`` for that fraction
  (e.g. a MIG profile such as ``nvidia.com/mig-3g.40gb``) or else one unit of
  ``gpu_shared_resource`` (``nvidia.com/gpu.shared``, what the NVIDIA device
  plugin advertises for time-sliced GPUs with ``renameByDefault: true``).

On the node, the NVIDIA device plugin picks which physical GPUs the pod gets;
the pool never places more GPUs on a node than it has, so GPUs are never
shared, but the exact indices (and NVLink pairing) are the plugin's choice.
``CUDA_VISIBLE_DEVICES`` is therefore not set in pods (the plugin sets
``NVIDIA_VISIBLE_DEVICES``); a CPU-only pod gets ``NVIDIA_VISIBLE_DEVICES=void``
so CUDA base images do not see the node's GPUs.

A pod the API server refuses (403: the hub's service account may not create
pods; 422: an invalid pod, e.g. a GPU limit the cluster does not know) fails
the spawn with the API server's own message, and the allocation goes back
unpaid (the mixin abandons the attempt).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from traitlets import Dict, Unicode

from ... import strictjson
from ...spawner import GPUPoolSpawner
from ...spawner.errors import GPUPoolRefused, SpawnFailure
from ...spawner.memory_hints import notice_file_env

try:
    from kubernetes_asyncio.client.rest import ApiException
    from kubespawner import KubeSpawner
except ImportError as e:  # pragma: no cover - depends on the extra
    raise ImportError(
        "GPUPoolKubeSpawner needs KubeSpawner: pip install 'gpupool_hub[kubernetes]' "
        "(jupyterhub-kubespawner>=7)"
    ) from e

__all__ = ["GPUPoolKubeSpawner"]


class GPUPoolKubeSpawner(GPUPoolSpawner, KubeSpawner):
    """KubeSpawner whose pods land on the node the gpupool service chose, with its GPU limit.

    Use ``c.GPUPoolSpawner.profiles`` (with ``spawner_override`` for per-profile
    KubeSpawner settings such as ``image``) instead of KubeSpawner's ``profile_list``.
    """

    gpupool_node_label = Unicode(
        "kubernetes.io/hostname",
        help="Node label whose value is the pool's node name (c.GPUPool.nodes[*].name); "
             "the pod requires it via node affinity.",
    ).tag(config=True)

    gpu_resource = Unicode("nvidia.com/gpu", help="Extended resource for whole GPUs.").tag(config=True)

    gpu_shared_resource = Unicode(
        "nvidia.com/gpu.shared",
        help="""Resource requested (one unit) for a GPU fraction with no entry in
        gpu_fraction_resources: the NVIDIA device plugin's time-sliced GPU
        ('nvidia.com/gpu.shared' with renameByDefault, or 'nvidia.com/gpu' without).""",
    ).tag(config=True)

    gpu_fraction_resources = Dict(
        {},
        help="""Resources for particular fractions, e.g. MIG slices::

            c.GPUPoolKubeSpawner.gpu_fraction_resources = {
                "0.4": {"nvidia.com/mig-3g.40gb": 1},
                "0.25": {"nvidia.com/mig-1g.10gb": 1},
            }

        Keys are the profile's gpu_fraction as a string; values map resource
        names to quantities. A MIG instance counts as its slices out of 7 (a
        3g.40gb is 3/7 ≈ 0.43 of the GPU), so the profile's fraction must not
        exceed that. A profile with ``"mig": "1g.10gb"`` gets
        ``nvidia.com/mig-1g.10gb: 1`` (the device plugin's mixed strategy)
        unless a key here names that MIG profile.""",
    ).tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.profile_list:
            self.log.warning("GPUPoolKubeSpawner ignores c.KubeSpawner.profile_list; "
                             "use c.GPUPoolSpawner.profiles with 'spawner_override'")

    async def load_user_options(self) -> None:
        """Profiles were applied by GPUPoolSpawner before start; KubeSpawner's profile_list is not used."""

    async def _make_create_pod_request(self, pod: Any, request_timeout: int) -> bool:
        """KubeSpawner's pod create (a 409 still deletes the old pod and retries); any other
        refusal becomes a spawn failure that says what the API server said."""
        try:
            return await super()._make_create_pod_request(pod, request_timeout)
        except ApiException as e:
            raise cluster_refusal(e) from e

    def gpupool_env(self, allocation: dict[str, Any] | None) -> dict[str, str]:
        env = {"GPUPOOL_API_URL": self.gpupool_server_api_url, **notice_file_env(self.notice_file, self.name)}
        if self.gpupool_profile is not None:
            env["GPUPOOL_PROFILE"] = self.gpupool_profile.slug
        if allocation:
            env["GPUPOOL_ALLOCATION"] = allocation["id"]
            env["GPUPOOL_NODE"] = allocation.get("node", "")
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    def gpu_limits(self, allocation: dict[str, Any]) -> dict[str, str]:
        gpus = allocation.get("gpus", [])
        profile = gpus[0].get("mig_profile") if len(gpus) == 1 else None
        if profile:  # one MIG instance: the device plugin's resource for its profile (mixed strategy)
            mapped = self.gpu_fraction_resources.get(profile)
            if mapped:
                return {str(k): str(v) for k, v in mapped.items()}
            return {f"nvidia.com/mig-{profile}": "1"}
        fractions = [Decimal(str(g.get("fraction", "1"))) for g in gpus]
        if len(fractions) == 1 and fractions[0] < 1:
            key = format(fractions[0].normalize(), "f")
            mapped = self.gpu_fraction_resources.get(key)
            if mapped:
                return {str(k): str(v) for k, v in mapped.items()}
            return {self.gpu_shared_resource: "1"}
        return {self.gpu_resource: str(len(gpus))} if gpus else {}

    def apply_gpupool_allocation(self, allocation: dict[str, Any] | None) -> None:
        """Pin the pod to the allocation's node and add its GPU limit, on top of the admin's settings.

        Set through the mixin's allocation overrides, so a restart (another
        node, or a CPU-only profile) starts again from the configured values.
        """
        super().apply_gpupool_allocation(allocation)  # also undoes the previous allocation's settings
        overrides = self.gpupool_allocation_overrides
        if not allocation:
            return
        expr = {"key": self.gpupool_node_label, "operator": "In", "values": [allocation["node"]]}
        terms = overrides.base("node_affinity_required")
        items = list(terms.values()) if isinstance(terms, dict) else list(terms)
        if not items:
            items = [{}]
        for term in items:
            term.setdefault("matchExpressions", []).append(expr)
        limits = self.gpu_limits(allocation)
        overrides.set({
            "node_affinity_required": dict(zip(terms.keys(), items)) if isinstance(terms, dict) and terms else items,
            "extra_resource_limits": {**self.extra_resource_limits, **limits},
            # extended resources: request == limit
            "extra_resource_guarantees": {**self.extra_resource_guarantees, **limits},
        })


def cluster_refusal(error: ApiException) -> GPUPoolRefused:
    """The API server's refusal of a pod, with its ``Status`` message (``pods is forbidden: …``)."""
    try:
        message = strictjson.loads(error.body or "{}").get("message") or ""
    except (ValueError, AttributeError):
        message = ""
    detail = message or (error.body if isinstance(error.body, str) else "") or "no message"
    return GPUPoolRefused(
        f"Kubernetes refused the pod ({error.status} {error.reason}): {detail}. An admin must fix the "
        "hub's Kubernetes settings (its service account's rights, or the pod it asks for).",
        reason=SpawnFailure.CLUSTER_REFUSED, status_code=500,
    )
