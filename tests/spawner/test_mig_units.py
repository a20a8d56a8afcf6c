"""KubeSpawner pods for a MIG profile: the device plugin's resource for that profile (no hub needed)."""

from __future__ import annotations

from tests.spawner.test_units import ALLOC, kube  # noqa: F401  (the fixture)

MIG_ALLOC = dict(ALLOC, gpus=[{"index": 1, "uuid": "GPU-1", "model": "NVIDIA A100-SXM4-80GB", "fraction": "0.428",
                               "mig_uuid": "MIG-1-3g-0", "mig_profile": "3g.40gb"}])


async def test_kube_mig_instance_asks_for_its_profile_resource(kube):  # noqa: F811
    s = kube()
    s.apply_gpupool_allocation(MIG_ALLOC)
    limits = (await s.get_pod_manifest()).spec.containers[0].resources.limits
    assert limits["nvidia.com/mig-3g.40gb"] == "1"
    assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu.shared" not in limits
    # an admin mapping for the profile (e.g. the device plugin's single strategy) wins
    single = kube(gpu_fraction_resources={"3g.40gb": {"nvidia.com/gpu": 1}})
    single.apply_gpupool_allocation(MIG_ALLOC)
    limits = (await single.get_pod_manifest()).spec.containers[0].resources.limits
    assert limits["nvidia.com/gpu"] == "1" and "nvidia.com/mig-3g.40gb" not in limits
