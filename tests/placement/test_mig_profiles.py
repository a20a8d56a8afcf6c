"""Requests for one MIG instance of a profile (``Request(mig=...)``), table-tested on real A100 layouts.

Layouts: "seven" = an A100 split into 7 × 1g.10gb; "mixed" = an A100 split
into 2 × 3g.40gb + 1 × 1g.10gb (the layouts NVIDIA documents for the 80 GB A100).
"""

from __future__ import annotations

import pytest

from gpupool_hub.placement import InvalidRequest, ModelUnavailable, NoCapacity, Pool, Request
from gpupool_hub.placement.mix import type_key

A100 = "NVIDIA A100-SXM4-80GB"


def seven(name: str) -> dict:
    return {"index": 0, "uuid": f"GPU-{name}", "model": A100,
            "mig": [{"uuid": f"MIG-{name}-1g-{i}", "profile": "1g.10gb"} for i in range(7)]}


def mixed(name: str, index: int = 0) -> dict:
    return {"index": index, "uuid": f"GPU-{name}", "model": A100,
            "mig": [{"uuid": f"MIG-{name}-3g-0", "profile": "3g.40gb"},
                    {"uuid": f"MIG-{name}-3g-1", "profile": "3g.40gb"},
                    {"uuid": f"MIG-{name}-1g-0", "profile": "1g.10gb"}]}


def node(name: str, *gpus: dict) -> dict:
    return {"name": name, "cpu_milli": 32000, "memory_mib": 65536,
            "gpus": [dict(g, index=i) for i, g in enumerate(gpus)]}


def one_node_two_gpus() -> Pool:
    return Pool([node("n1", seven("a"), mixed("b"))])


# Each case: pool builder, profiles already requested in order (their instances), then the next
# request's profile and the instance it must get (None: no capacity now).
CASES = [
    # an empty pool: both GPUs untouched (7 free slices each); the lone 1g of the mixed GPU
    # goes first, the GPU laid out for seven 1g's keeps them for requests that come in numbers
    ("first 1g takes the odd leftover", one_node_two_gpus, [], "1g.10gb", "MIG-b-1g-0"),
    ("then 1g goes to the 7x1g GPU", one_node_two_gpus, ["1g.10gb"], "1g.10gb", "MIG-a-1g-0"),
    ("1g packs onto the GPU already in use", one_node_two_gpus, ["1g.10gb", "1g.10gb"], "1g.10gb", "MIG-a-1g-1"),
    ("3g takes a 3g instance", one_node_two_gpus, [], "3g.40gb", "MIG-b-3g-0"),
    ("second 3g, the other one", one_node_two_gpus, ["3g.40gb"], "3g.40gb", "MIG-b-3g-1"),
    ("no third 3g although 7 slices are free", one_node_two_gpus, ["3g.40gb", "3g.40gb"], "3g.40gb", None),
    # with a 3g in use on the mixed GPU (4 free slices there), a 1g goes there, not to the untouched GPU
    ("1g joins the used GPU", one_node_two_gpus, ["3g.40gb"], "1g.10gb", "MIG-b-1g-0"),
    ("all 1g's taken", one_node_two_gpus, ["1g.10gb"] * 8, "1g.10gb", None),
]


@pytest.mark.parametrize("what,build,before,profile,expected", CASES, ids=[c[0] for c in CASES])
def test_mig_profile_table(what, build, before, profile, expected):
    pool = build()
    for i, p in enumerate(before):
        pool.allocate(f"before-{i}", Request(mig=p))
    if expected is None:
        with pytest.raises(NoCapacity):
            pool.allocate("next", Request(mig=profile))
        return
    placement = pool.allocate("next", Request(mig=profile))
    (share,) = placement.gpus
    assert share.mig_uuid == expected, what
    assert share.mig_profile == profile
    assert share.milli == {"1g.10gb": 142, "3g.40gb": 428}[profile]
    assert pool.describe(placement) == f"n1, MIG {expected} ({profile}) of GPU {share.index} ({A100})"


def test_packs_nodes_and_keeps_untouched_gpus():
    # two nodes with the same layouts; the second request of a node already in use stays there
    pool = Pool([node("n1", seven("a1"), mixed("b1")), node("n2", seven("a2"), mixed("b2"))])
    first = pool.allocate("x", Request(mig="3g.40gb"))
    second = pool.allocate("y", Request(mig="1g.10gb"))
    assert first.node == second.node
    assert second.gpus[0].mig_uuid.startswith("MIG-b")  # on the GPU the 3g already uses
    # released, the instance is free again and the same request gets it back
    pool.release("y")
    assert pool.allocate("z", Request(mig="1g.10gb")).gpus[0].mig_uuid == second.gpus[0].mig_uuid


def test_only_the_profile_asked_for_and_never_a_plain_gpu():
    pool = Pool([node("n1", mixed("b"), {"uuid": "GPU-plain", "model": A100})])
    # 2 × 3g + 1g: a 2g request never takes a 3g instance, and never the plain GPU
    with pytest.raises(ModelUnavailable, match="2g.20gb MIG instance"):
        pool.allocate("a", Request(mig="2g.20gb"))
    # models narrow as for any request
    with pytest.raises(ModelUnavailable):
        pool.allocate("b", Request(mig="1g.10gb", models=frozenset({"NVIDIA H100 80GB HBM3"})))
    got = pool.allocate("c", Request(mig="1G.10GB", models=frozenset({A100})))
    assert got.gpus[0].mig_uuid == "MIG-b-1g-0"
    # whole-GPU requests still get the plain GPU only, fractions still their usual slots
    assert pool.allocate("d", Request(gpus=1)).gpus[0].uuid == "GPU-plain"


def test_required_instance_and_cpu_memory():
    pool = Pool([node("n1", seven("a"), mixed("b"))])
    got = pool.allocate("a", Request(mig="1g.10gb", required=frozenset({"MIG-a-1g-5"})))
    assert got.gpus[0].mig_uuid == "MIG-a-1g-5"
    with pytest.raises(NoCapacity):
        pool.allocate("b", Request(mig="1g.10gb", required=frozenset({"MIG-a-1g-5"})))
    with pytest.raises(ModelUnavailable):
        pool.allocate("c", Request(mig="1g.10gb", cpu_milli=64000))


def test_a30_instances_are_quarters():
    pool = Pool([{"name": "n", "cpu_milli": 8000, "memory_mib": 8192, "gpus": [
        {"model": "NVIDIA A30", "mig": [{"profile": "2g.12gb"}, {"profile": "1g.6gb"}, {"profile": "1g.6gb"}]}]}])
    assert pool.allocate("a", Request(mig="2g.12gb")).gpus[0].milli == 500
    assert pool.allocate("b", Request(mig="1g.6gb")).gpus[0].milli == 250


def test_restore_after_restart_keeps_the_instance():
    pool = one_node_two_gpus()
    placement = pool.allocate("a", Request(mig="3g.40gb"))
    fresh = one_node_two_gpus()
    fresh.restore("a", placement)
    assert fresh.allocate("b", Request(mig="3g.40gb")).gpus[0].mig_uuid == "MIG-b-3g-1"


@pytest.mark.parametrize("bad,message", [
    (dict(mig="1g"), "not a MIG profile name"),
    (dict(mig="big"), "not a MIG profile name"),
    (dict(mig="1g.10gb", gpus=1), "leave out gpus"),
    (dict(mig="1g.10gb", gpu_milli=100), "leave out gpus"),
    (dict(mig=7), "MIG profile is a name"),
])
def test_bad_mig_requests(bad, message):
    with pytest.raises(InvalidRequest, match=message):
        Request(**bad)


def test_the_wait_queue_holds_back_a_node_with_the_profile():
    from gpupool_hub.queue.dispatch import reserve_node

    plain = {"name": "n0-plain", "cpu_milli": 32000, "memory_mib": 65536,
             "gpus": [{"uuid": "GPU-p", "model": A100}]}
    pool = Pool([plain, node("n1", seven("a")), node("n2", mixed("b"))])
    assert reserve_node(pool, Request(mig="3g.40gb")) == "n2"  # the only node with 3g instances
    assert reserve_node(pool, Request(mig="1g.10gb")) == "n1"  # the most free 1g's
    assert reserve_node(pool, Request(mig="2g.20gb")) is None


def test_mig_requests_stay_out_of_the_policys_request_mix():
    pool = one_node_two_gpus()
    pool.expect([Request(mig="3g.40gb"), Request(gpu_milli=500)])
    assert list(pool.policy.mix.expected) == [type_key(Request(gpu_milli=500))]
    pool.allocate("a", Request(mig="1g.10gb"))
    assert not pool.policy.mix.counts  # not observed either
