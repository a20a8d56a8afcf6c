"""FGD's fragmentation model: the reach of fractions, and request shapes the caller declares."""

from __future__ import annotations

import pytest

from gpupool_hub.placement import GPUShare, Placement, Pool, Request, get_policy, load_nodes

from .conftest import plain_node

HALF = Request(cpu_milli=6000, gpu_milli=500)        # a CPU-hungry half GPU
SMALL_WHOLE = Request(cpu_milli=2000, gpus=1)


def half_used_pool(policy):
    """Node a: one GPU half used, CPU for one more HALF. Node b: two whole GPUs, plenty of CPU."""
    pool = Pool(load_nodes([plain_node("a", 2, cpu_milli=14000), plain_node("b", 2, cpu_milli=20000)]),
                policy=policy, seed=policy.seed)
    g = pool.by_name["a"].node.gpus[0]
    pool.restore("held", Placement(node="a", gpus=(GPUShare(0, g.uuid, g.model, 500),), cpu_milli=6000))
    return pool


@pytest.mark.parametrize("seed", range(6))
def test_a_fraction_fills_the_node_whose_cpu_admits_no_more_of_it(seed):
    # On a, one more HALF fits the CPU, so only one device is within its reach: filling the half-used
    # GPU there costs little. Putting it on b breaks a whole GPU on a node that could take three.
    policy = get_policy("fgd", workload=[HALF, SMALL_WHOLE], learn=False, seed=seed)
    pool = half_used_pool(policy)
    p = pool.allocate("x", HALF)
    assert (p.node, p.gpus[0].index) == ("a", 0)


def test_without_the_reach_limit_both_nodes_look_alike():
    picks = set()
    for seed in range(6):
        pool = Pool(load_nodes([plain_node("a", 2, cpu_milli=14000), plain_node("b", 2, cpu_milli=20000)]),
                    policy=get_policy("fgd", workload=[HALF, SMALL_WHOLE], learn=False, fraction_reach="off"),
                    seed=seed)
        g = pool.by_name["a"].node.gpus[0]
        pool.restore("held", Placement(node="a", gpus=(GPUShare(0, g.uuid, g.model, 500),), cpu_milli=6000))
        picks.add(pool.allocate("x", HALF).node)
    assert picks == {"a", "b"}  # a tie, settled by the seeded node order


def test_fraction_reach_is_validated():
    with pytest.raises(ValueError, match="fraction_reach"):
        get_policy("fgd", fraction_reach="nearest")
