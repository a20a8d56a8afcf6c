"""Scarce nodes last: the few nodes that alone can host a declared shape are given out last."""

from __future__ import annotations

import pytest

from gpupool_hub.placement import NoCapacity, Pool, Request
from gpupool_hub.placement.scarce import node_weights

MODEL = "NVIDIA A100-SXM4-80GB"
BIG = Request(gpus=8, cpu_milli=120000, memory_mib=737280)  # fits only the 128-CPU nodes
ONE = Request(gpus=1, cpu_milli=4000, memory_mib=16384)


def pool(seed: int, big: int = 1, small: int = 3) -> Pool:
    """``big`` 8-GPU nodes with 128 CPUs and 768 GiB, ``small`` 8-GPU nodes with 64 CPUs."""
    return Pool([{"name": f"big{i}", "cpu_milli": 128000, "memory_mib": 786432, "gpus": {"count": 8, "model": MODEL}}
                 for i in range(big)] +
                [{"name": f"small{i}", "cpu_milli": 64000, "memory_mib": 262144, "gpus": {"count": 8, "model": MODEL}}
                 for i in range(small)], seed=seed)


@pytest.mark.parametrize("declared, weights", [
    # the big shape fits 1 node of 4: that node weighs 1, the others the whole pool
    ([BIG], [1, 4, 4, 4]),
    # a 1-GPU shape fits every node: nothing is scarce
    ([ONE], None),
    # 8 GPUs with 64 CPUs fits every node too: only the 120-CPU shape makes big0 scarce
    ([ONE, Request(gpus=8, cpu_milli=64000, memory_mib=262144), BIG], [1, 4, 4, 4]),
    # pinned shapes name their node: not a shape of the pool
    ([Request(gpus=1, required=frozenset({"big0/gpu0"}))], None),
])
def test_a_node_weighs_the_node_count_of_the_scarcest_shape_it_alone_hosts(declared, weights):
    p = pool(0)
    assert node_weights(p.nodes, declared) == weights


@pytest.mark.parametrize("seed", range(8))
def test_small_servers_land_on_the_big_node_only_when_they_fit_nowhere_else(seed):
    p = pool(seed)
    p.expect([BIG])  # the hub's 8-GPU, 120-CPU profile
    # 24 one-GPU servers fill the three small nodes first, whatever the seeded node order
    for i in range(24):
        assert p.allocate(f"s{i}", ONE).node.startswith("small")
    assert p.allocate("s24", ONE).node == "big0"  # nowhere else: the big node takes it
    p.release("s24")
    p.release("s0")
    assert p.allocate("s25", ONE).node.startswith("small")  # a small node has room again
    assert p.allocate("big", BIG).node == "big0"  # the big profile found its node empty


def first_small_servers_on_the_big_node(declare: list[list[Request]]) -> int:
    """Over 8 seeds: how often the first 1-GPU server lands on big0, after these declarations."""
    landed = 0
    for seed in range(8):
        p = pool(seed)
        for shapes in declare:
            p.expect(shapes)
        landed += p.allocate("s0", ONE).node == "big0"
    return landed


def test_without_the_declared_big_shape_small_servers_spoil_the_big_node():
    # nothing declared (or the declaration cleared): FGD sees four equal nodes and its
    # seeded tie-break puts the first small server on big0 now and then, and the big
    # request then waits for it to stop
    assert first_small_servers_on_the_big_node([]) > 0
    assert first_small_servers_on_the_big_node([[BIG], []]) > 0
    assert first_small_servers_on_the_big_node([[BIG]]) == 0
    p = next(p for p in (pool(s) for s in range(8)) if p.allocate("s0", ONE).node == "big0")
    with pytest.raises(NoCapacity):
        p.allocate("big", BIG)
