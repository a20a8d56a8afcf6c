import pytest

from gpupool_hub.placement import (
    GPUShare, InvalidRequest, ModelUnavailable, NoCapacity, Placement, PlacementConflict, PlacementError,
    Pool, Policy, Request, get_policy, load_nodes, register_policy,
)

from .conftest import plain_node

RTX = "NVIDIA GeForce RTX 3090"
A100 = "NVIDIA A100-SXM4-80GB"


def small_pool(policy="fgd", seed=0):
    return Pool(load_nodes([plain_node("a", 4, RTX), plain_node("b", 2, A100, cpu_milli=16000)]),
                policy=get_policy(policy), seed=seed)


def test_api_roundtrip():
    pool = small_pool()
    p = pool.allocate("x", Request(cpu_milli=2000, memory_mib=8192, gpus=2, models=frozenset({RTX})))
    assert p.node == "a" and len(p.gpus) == 2 and all(g.milli == 1000 and g.model == RTX for g in p.gpus)
    assert p.cpu_milli == 2000 and p.memory_mib == 8192
    snap = {n["node"]: n for n in pool.snapshot()}
    held = [g for g in snap["a"]["gpus"] if g["holders"]]
    assert [g["holders"] for g in held] == [{"x": 1000}, {"x": 1000}]
    assert snap["a"]["cpu_free"] == 62000
    assert pool.release("x") == p
    assert all(not g["holders"] for n in pool.snapshot() for g in n["gpus"])
    with pytest.raises(PlacementConflict):
        pool.release("x")


def test_model_match_is_case_insensitive_and_exact():
    pool = small_pool()
    p = pool.allocate("x", Request(gpus=1, models=frozenset({"nvidia a100-sxm4-80gb"})))
    assert p.node == "b"
    with pytest.raises(ModelUnavailable) as info:
        pool.allocate("y", Request(gpus=1, models=frozenset({"A100"})))
    assert "A100" in str(info.value) or "a100" in str(info.value)


def test_no_capacity_vs_model_unavailable():
    pool = small_pool()
    pool.allocate("big", Request(gpus=4))
    with pytest.raises(NoCapacity) as info:
        pool.allocate("more", Request(gpus=3))
    assert "free now" in str(info.value)
    assert info.value.free.per_model[A100]["whole_free"] == 2
    with pytest.raises(ModelUnavailable):
        pool.allocate("never", Request(gpus=5))          # no node has 5 GPUs
    with pytest.raises(ModelUnavailable):
        pool.allocate("never2", Request(cpu_milli=10 ** 6))  # no node has that CPU
    assert "never" not in pool


def test_errors_are_explicit_classes():
    assert issubclass(NoCapacity, PlacementError) and issubclass(ModelUnavailable, PlacementError)
    assert issubclass(InvalidRequest, ValueError)


def test_duplicate_alloc_id_refused():
    pool = small_pool()
    pool.allocate("x", Request(gpu_milli=100))
    with pytest.raises(PlacementConflict):
        pool.allocate("x", Request(gpu_milli=100))


@pytest.mark.parametrize("policy", ["fgd", "best-fit", "first-fit", "random"])
def test_fractions_share_a_gpu_before_breaking_a_whole_one(policy):
    pool = Pool(load_nodes([plain_node("a", 2)]), policy=get_policy(policy))
    a = pool.allocate("a", Request(gpu_milli=300))
    b = pool.allocate("b", Request(gpu_milli=500))
    assert a.gpus[0].index == b.gpus[0].index
    # the other GPU is still whole
    assert pool.allocate("c", Request(gpus=1)).gpus[0].index != a.gpus[0].index
    with pytest.raises(NoCapacity):
        pool.allocate("d", Request(gpu_milli=300))  # 200 left on the shared GPU


def test_fgd_keeps_whole_nodes_free():
    # Two 8-GPU nodes: eight single GPUs must not be spread over both, or the 8-GPU job fails.
    pool = Pool(load_nodes([plain_node("a", 8, cpu_milli=96000), plain_node("b", 8, cpu_milli=96000)]))
    for i in range(8):
        pool.allocate(f"s{i}", Request(cpu_milli=4000, gpus=1))
    assert pool.allocate("big", Request(cpu_milli=4000, gpus=8)).node in ("a", "b")


def test_restore_validates_and_applies():
    pool = small_pool()
    p = pool.allocate("x", Request(cpu_milli=1000, gpu_milli=250))
    fresh = small_pool()
    fresh.restore("x", p)
    assert fresh.snapshot() == pool.snapshot()
    with pytest.raises(PlacementConflict):
        fresh.restore("x", p)  # id in use
    bad = Placement(node="a", gpus=(GPUShare(0, "GPU-wrong", RTX, 1000),))
    with pytest.raises(PlacementConflict, match="GPU-wrong"):
        fresh.restore("y", bad)
    full = Placement(node="a", gpus=(GPUShare(p.gpus[0].index, p.gpus[0].uuid, RTX, 1000),))
    with pytest.raises(PlacementConflict, match="milli free"):
        fresh.restore("z", full)
    with pytest.raises(PlacementConflict, match="unknown node"):
        fresh.restore("w", Placement(node="nope", gpus=()))


def test_describe_messages():
    pool = small_pool()
    assert pool.describe(pool.allocate("c", Request(cpu_milli=100))).endswith("no GPU")
    assert "25% of GPU" in pool.describe(pool.allocate("f", Request(gpu_milli=250)))
    assert ", GPUs " in pool.describe(pool.allocate("w", Request(gpus=2)))


def test_free_summary_text():
    pool = small_pool()
    pool.allocate("f", Request(gpu_milli=250, models=frozenset({RTX})))
    text = str(pool.free_summary())
    assert RTX in text and "3 whole GPUs free" in text and "largest share 75% of a shared GPU" in text


def test_mig_devices_are_exclusive_fraction_slots():
    nodes = load_nodes([{"name": "m", "cpu_milli": 8000, "memory_mib": 8192, "gpus": [
        {"index": 0, "uuid": "GPU-0", "model": A100,
         "mig": [{"uuid": "MIG-1", "profile": "1g.10gb"}, {"uuid": "MIG-3", "profile": "3g.40gb"}]}]}])
    pool = Pool(nodes)
    p = pool.allocate("a", Request(gpu_milli=100))
    assert p.gpus[0].mig_uuid == "MIG-1"  # tightest instance
    with pytest.raises(ModelUnavailable):
        pool.allocate("w", Request(gpus=1))  # a MIG GPU is never handed out whole
    q = pool.allocate("b", Request(gpu_milli=100))
    assert q.gpus[0].mig_uuid == "MIG-3"
    with pytest.raises(NoCapacity):
        pool.allocate("c", Request(gpu_milli=50))  # instances are not shared
    assert "MIG MIG-3" in pool.describe(q)
    pool.release("a")
    fresh = Pool(nodes)
    fresh.restore("b", q)
    assert fresh.allocate("a", Request(gpu_milli=100)).gpus[0].mig_uuid == "MIG-1"


def test_mixed_model_node_respects_model_constraint():
    nodes = load_nodes([{"name": "mix", "cpu_milli": 8000, "memory_mib": 8192, "gpus": [
        {"index": 0, "model": RTX}, {"index": 1, "model": A100}]}])
    pool = Pool(nodes)
    assert pool.allocate("a", Request(gpus=1, models=frozenset({A100}))).gpus[0].index == 1
    with pytest.raises(NoCapacity):
        pool.allocate("b", Request(gpu_milli=10, models=frozenset({A100})))
    assert pool.allocate("c", Request(gpu_milli=10, models=frozenset({RTX}))).gpus[0].index == 0


@pytest.mark.parametrize("policy", ["fgd", "best-fit", "first-fit", "random"])
def test_same_state_and_request_same_answer(policy):
    reqs = [Request(cpu_milli=1000 * (i % 5), gpu_milli=(100 + 37 * i) % 900 + 50) if i % 3 else Request(gpus=1 + i % 2)
            for i in range(40)]

    def run():
        pool = Pool(load_nodes([plain_node(f"n{i}", 4) for i in range(6)]), policy=get_policy(policy), seed=7)
        out = []
        for i, r in enumerate(reqs):
            try:
                out.append(pool.allocate(str(i), r))
            except NoCapacity:
                out.append(None)
        return out

    assert run() == run()


def test_a_new_policy_is_one_class():
    class MostFreeCPU(Policy):
        name = "most-free-cpu"

        def score(self, ns, req):
            return ns.cpu_free

    register_policy("most-free-cpu", MostFreeCPU)
    pool = Pool(load_nodes([plain_node("a", 1, cpu_milli=8000), plain_node("b", 1, cpu_milli=16000)]),
                policy="most-free-cpu")
    assert pool.allocate("x", Request(cpu_milli=1000, gpu_milli=10)).node == "b"


def test_unknown_policy_name():
    with pytest.raises(ValueError, match="fgd"):
        get_policy("best")


def test_fgd_workload_prior():
    policy = get_policy("fgd", workload=[Request(gpus=2)] * 10 + [Request(gpu_milli=500)], learn=False)
    pool = Pool(load_nodes([plain_node("a", 2), plain_node("b", 2)]), policy=policy)
    pool.allocate("f", Request(gpu_milli=500))
    # the second fraction joins the first instead of breaking node b's pair
    assert pool.allocate("g", Request(gpu_milli=500)).node == pool.get("f").node
    assert pool.allocate("p", Request(gpus=2)).node != pool.get("f").node
