"""Whole nodes kept for a declared shape of several GPUs: smaller requests wait rather than
break the last few (placement/kept.py)."""

from __future__ import annotations

import pytest

from gpupool_hub.placement import NoCapacity, Pool, Request
from gpupool_hub.placement.kept import KEEP_WHOLE, guards

MODEL = "NVIDIA A100-SXM4-80GB"
EIGHT = Request(gpus=8, cpu_milli=32000, memory_mib=131072)
FOUR = Request(gpus=4, cpu_milli=16000, memory_mib=65536)
ONE = Request(gpus=1, cpu_milli=4000, memory_mib=16384)
HALF = Request(gpu_milli=500, cpu_milli=2000, memory_mib=8192)


def pool(nodes: int, seed: int = 0) -> Pool:
    return Pool([{"name": f"n{i:02d}", "cpu_milli": 64000, "memory_mib": 524288,
                  "gpus": {"count": 8, "model": MODEL}} for i in range(nodes)], seed=seed)


def put(p: Pool, alloc_id: str, req: Request, node: str) -> None:
    """Place ``req`` on ``node``: the tests set the pool's state, not FGD's choices."""
    assert p.allocate(alloc_id, req, avoid=frozenset(ns.name for ns in p.nodes) - {node}).node == node


def fill(p: Pool, nodes: list[str], tag: str) -> None:
    """Every free GPU of ``nodes`` taken by a 1-GPU server."""
    for name in nodes:
        for j in range(p.by_name[name].n_full):
            put(p, f"{tag}-{name}-{j}", ONE, name)


def whole_nodes(p: Pool) -> list[str]:
    return sorted(ns.name for ns in p.nodes if ns.n_full == 8)


@pytest.mark.parametrize("nodes, declared, expected", [
    # 16 nodes fit 8 GPUs: four kept nodes are a quarter of them
    (16, [EIGHT], ((8, None),)),
    # 15: four would be more than a quarter, so nothing is kept (the policy's reserve only steers)
    (15, [EIGHT], ()),
    # shapes of one GPU or a share keep nothing: any GPU that frees serves them
    (64, [ONE, HALF], ()),
    # each shape of several GPUs is guarded, fewest GPUs first; a repeat counts once
    (64, [EIGHT, FOUR, EIGHT], ((4, None), (8, None))),
    # a model the pool lacks fits no node: nothing to keep
    (64, [Request(gpus=8, models=frozenset({"NVIDIA H100"}))], ()),
])
def test_which_declared_shapes_keep_nodes(nodes, declared, expected):
    assert guards(pool(nodes).nodes, declared) == expected


@pytest.mark.parametrize("seed", range(4))
def test_smaller_servers_wait_rather_than_break_the_last_kept_nodes(seed):
    p = pool(16, seed)
    p.expect([EIGHT])  # the hub's 8-GPU profile
    broken = [f"n{i:02d}" for i in range(16 - KEEP_WHOLE - 1)]
    fill(p, broken, "full")
    assert len(whole_nodes(p)) == KEEP_WHOLE + 1
    # one whole node more than kept: a one-GPU server may still break one (nowhere else to go)
    assert p.allocate("breaks-one", ONE).node not in broken
    kept = whole_nodes(p)
    assert len(kept) == KEEP_WHOLE
    fill(p, [p.get("breaks-one").node], "rest")
    # now only the four kept nodes have room: a one-GPU server, a share and a 4-GPU server wait
    for alloc_id, req in (("one", ONE), ("half", HALF), ("four", FOUR)):
        with pytest.raises(NoCapacity):
            p.allocate(alloc_id, req)
    # the 8-GPU server starts at once, on a kept node
    assert p.allocate("big", EIGHT).node in kept
    # a release elsewhere gives the one-GPU server its place
    p.release("full-n00-0")
    assert p.allocate("one", ONE).node == "n00"


def test_a_share_takes_a_shared_gpu_but_breaks_no_whole_gpu_of_a_kept_node():
    p = pool(16)
    p.expect([EIGHT])
    fill(p, [f"n{i:02d}" for i in range(16 - KEEP_WHOLE)], "full")
    with pytest.raises(NoCapacity):
        p.allocate("half", HALF)  # it would break a whole GPU of a kept node
    p.release("full-n03-0")
    assert p.allocate("half", HALF).node == "n03"
    assert p.allocate("half-2", HALF).node == "n03"  # beside it on the same GPU
    assert len(whole_nodes(p)) == KEEP_WHOLE


def test_a_small_hub_keeps_nothing_back():
    """Four nodes: a kept node would be a quarter of the GPUs standing idle; servers never
    wait for that here, as before."""
    p = pool(4)
    p.expect([EIGHT])
    for i in range(32):
        p.allocate(f"s{i}", ONE)
    assert p.allocated_gpu_milli == 32000


def test_without_a_declared_shape_nothing_is_kept():
    p = pool(16)
    for i in range(16 * 8):
        p.allocate(f"s{i}", ONE)
    assert p.allocated_gpu_milli == 16 * 8000


def test_the_gpus_kept_whole_are_not_free_for_a_smaller_request():
    """What the spawn page counts free for a profile (``Pool.withheld``): the whole GPUs of the
    kept nodes are withheld from a 1-GPU or 4-GPU request and from a share, not from the 8-GPU
    one they are kept for; with one whole node more than kept, nothing is withheld."""
    p = pool(16)
    p.expect([EIGHT])
    fill(p, [f"n{i:02d}" for i in range(16 - KEEP_WHOLE - 1)], "full")
    assert p.withheld(ONE) == {}  # five whole nodes: a one-GPU server may still take one
    fill(p, ["n11"], "rest")
    for req in (ONE, FOUR, HALF):
        assert p.withheld(req) == {MODEL: 8 * KEEP_WHOLE}
    assert p.withheld(EIGHT) == {}
    assert p.withheld(Request(gpus=1, models=frozenset({"NVIDIA H100"}))) == {}  # not its model
    p.allocate("big", EIGHT)
    assert p.withheld(ONE) == {MODEL: 8 * (KEEP_WHOLE - 1)}


def test_the_largest_block_open_to_a_request_leaves_out_the_kept_nodes():
    """``Pool.open_blocks``: the pool's largest whole block is on a kept node, so a 4-GPU
    request's card must read the most whole GPUs it may take on one node instead. It grows
    as a server on an open node ends, and is empty for a request nothing is kept from."""
    p = pool(16)
    p.expect([EIGHT])
    fill(p, [f"n{i:02d}" for i in range(16 - KEEP_WHOLE)], "full")
    p.release("full-n03-0")
    p.release("full-n03-1")
    p.release("full-n07-0")
    assert p.open_blocks(FOUR) == {MODEL: 2}  # n03; the four whole nodes are kept for eight
    assert p.free_summary().per_model[MODEL]["largest_whole_block"] == 8
    p.release("full-n03-2")
    assert p.open_blocks(FOUR) == {MODEL: 3}
    assert p.open_blocks(EIGHT) == {}  # they are kept for it
    assert p.open_blocks(ONE) == {}  # one GPU needs no block
    assert p.open_blocks(Request(gpus=4, models=frozenset({"NVIDIA H100"}))) == {}  # not its model
