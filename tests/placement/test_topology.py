"""Table tests on real topologies (DGX-1V hybrid cube-mesh, 4-GPU NVLink-pair box)."""

import time

import pytest

from gpupool_hub.placement import Pool, Request, get_policy, load_nodes

from .conftest import DGX1V_NVLINKS, dgx1v_node, rtx4_node


def indices(placement):
    return tuple(sorted(g.index for g in placement.gpus))


@pytest.mark.parametrize("policy", ["fgd", "best-fit", "first-fit", "random"])
def test_dgx1v_four_pairs_partition_into_nvlinked_pairs(policy):
    pool = Pool(load_nodes([dgx1v_node()]), policy=get_policy(policy))
    pairs = [indices(pool.allocate(f"p{i}", Request(gpus=2))) for i in range(4)]
    assert sorted(g for p in pairs for g in p) == list(range(8))
    for a, b in pairs:
        assert DGX1V_NVLINKS.get((a, b), 0) == 2, pairs  # every pair on a double NVLink
    # one of the two best-scoring perfect matchings of double links
    assert set(pairs) in ({(0, 3), (1, 2), (4, 7), (5, 6)}, {(2, 3), (6, 7), (0, 4), (1, 5)})


def test_dgx1v_two_quads():
    pool = Pool(load_nodes([dgx1v_node()]))
    assert {indices(pool.allocate("a", Request(gpus=4))), indices(pool.allocate("b", Request(gpus=4)))} == {
        (0, 1, 2, 3), (4, 5, 6, 7)}


def test_dgx1v_eight_and_one():
    pool = Pool(load_nodes([dgx1v_node()]))
    assert indices(pool.allocate("a", Request(gpus=8))) == tuple(range(8))
    pool.release("a")
    singles = [indices(pool.allocate(f"s{i}", Request(gpus=1)))[0] for i in range(8)]
    assert sorted(singles) == list(range(8))


@pytest.mark.parametrize("free, want", [
    ((0, 2, 4, 5), (4, 5)),   # single NVLink everywhere: prefer the same PCIe switch
    ((0, 4, 5, 6), (5, 6)),   # a double link beats single ones
    ((0, 1, 3), (0, 3)),      # dual NVLink within a socket
    ((0, 1, 4), (0, 4)),      # dual NVLink across sockets beats a single one
])
def test_dgx1v_pair_choice_from_partial_state(free, want):
    pool = Pool(load_nodes([dgx1v_node()]))
    busy = [g for g in range(8) if g not in free]
    from gpupool_hub.placement import GPUShare, Placement
    node = pool.nodes[0].node
    pool.restore("busy", Placement(node="dgx1", gpus=tuple(
        GPUShare(g, node.gpus[g].uuid, node.gpus[g].model, 1000) for g in busy)))
    assert indices(pool.allocate("x", Request(gpus=2))) == want


def test_dgx1v_pairs_after_a_single_leave_linked_pairs():
    pool = Pool(load_nodes([dgx1v_node()]))
    pool.allocate("one", Request(gpus=1))
    pairs = [indices(pool.allocate(f"p{i}", Request(gpus=2))) for i in range(3)]
    assert all(DGX1V_NVLINKS.get(p, 0) >= 1 for p in pairs), pairs


def test_four_gpu_box_gets_linked_pairs():
    pool = Pool(load_nodes([rtx4_node()]))
    got = {indices(pool.allocate("a", Request(gpus=2))), indices(pool.allocate("b", Request(gpus=2)))}
    assert got == {(0, 3), (1, 2)}


def test_four_gpu_box_single_then_pair_keeps_a_link():
    pool = Pool(load_nodes([rtx4_node()]))
    pool.allocate("a", Request(gpus=1))
    # whichever GPU the single took, a linked pair must remain for the next request
    assert indices(pool.allocate("b", Request(gpus=2))) in {(0, 3), (1, 2)}


def test_describe_says_nvlink():
    pool = Pool(load_nodes([rtx4_node()]))
    p = pool.allocate("a", Request(gpus=2))
    assert pool.describe(p).startswith("box4, GPUs 0+3 joined by NVLink")


def test_sixteen_gpu_node_is_fast():
    # NVSwitch-less 16-GPU node with a ring of NVLinks and two PCIe halves: no exponential search.
    links = []
    for a in range(16):
        for b in range(a + 1, 16):
            nv = 2 if b == a + 1 or (a == 0 and b == 15) else 0
            links.append({"gpus": [a, b], "nvlinks": nv, "pcie": "NODE" if (a < 8) == (b < 8) else "SYSTEM"})
    node = {"name": "big", "cpu_milli": 256000, "memory_mib": 2 ** 21,
            "gpus": {"count": 16, "model": "H100"}, "links": links}
    pool = Pool(load_nodes([node]))
    t0 = time.perf_counter()
    for size in (2, 4, 8, 3, 5, 6, 7):
        p = pool.allocate(f"a{size}", Request(gpus=size))
        pool.release(f"a{size}")
        assert len(p.gpus) == size
    got = [indices(pool.allocate(f"q{i}", Request(gpus=4))) for i in range(4)]
    assert time.perf_counter() - t0 < 2.0
    assert sorted(g for s in got for g in s) == list(range(16))
    # a ring carved into 4 runs of 4 consecutive GPUs: every set has 3 NVLinked neighbours
    for s in got:
        linked = sum(1 for a in s for b in s if a < b and (b == a + 1 or (a == 0 and b == 15)))
        assert linked == 3, got


# Two DGX-1V boards in one 16-GPU node (NVLink only within a board) and a DGX-2-like NVSwitch node.
SIXTEEN_CASES = [
    ("two boards: 8+8 are the boards", "2x-cube-mesh", 8, 2, {(0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15)}),
    ("two boards: four quads", "2x-cube-mesh", 4, 4, {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)}),
    ("dgx2: 8+8 are the PCIe halves", "dgx2-like", 8, 2, {tuple(range(8)), tuple(range(8, 16))}),
    ("dgx2: four quads under their switches", "dgx2-like", 4, 4, {tuple(range(q, q + 4)) for q in (0, 4, 8, 12)}),
    ("dgx2: eight switch pairs", "dgx2-like", 2, 8, {(p, p + 1) for p in range(0, 16, 2)}),
]


@pytest.mark.parametrize("name, topo, k, n, want", SIXTEEN_CASES, ids=[c[0] for c in SIXTEEN_CASES])
def test_sixteen_gpu_topologies_carve_into_their_natural_sets(name, topo, k, n, want):
    from benchmarks.placement_pick import TOPOLOGIES
    pool = Pool([TOPOLOGIES[topo]()])
    assert {indices(pool.allocate(f"r{i}", Request(gpus=k))) for i in range(n)} == want


def test_two_boards_pairs_are_double_nvlinked():
    from benchmarks.placement_pick import CUBE_MESH, TOPOLOGIES
    pool = Pool([TOPOLOGIES["2x-cube-mesh"]()])
    pairs = [indices(pool.allocate(f"p{i}", Request(gpus=2))) for i in range(8)]
    assert all(a // 8 == b // 8 and CUBE_MESH[(a % 8, b % 8)] == 2 for a, b in pairs), pairs
