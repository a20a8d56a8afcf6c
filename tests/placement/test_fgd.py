"""FGD's fragmentation model: the reach of fractions, and request shapes the caller declares."""

from __future__ import annotations

import pytest

from gpupool_hub.placement import GPUShare, InvalidRequest, NoCapacity, Placement, Pool, Request, get_policy, load_nodes

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


# --- Placement that knows what may come (issue 18) -------------------------------------------

A100 = "NVIDIA A100-SXM4-80GB"


def vdk_pool(seed=0, **fgd):
    """VDK scenario 2: 4 nodes × 10 GPUs."""
    nodes = [plain_node(f"node-{i}", 10, A100, cpu_milli=64000, memory_mib=512 * 1024) for i in range(4)]
    return Pool(load_nodes(nodes), policy=get_policy("fgd", seed=seed, **fgd), seed=seed)


def servers(k):
    return Request(cpu_milli=4000 * k, memory_mib=16384 * k, gpus=k)


def replay_vdk(pool, history_gpus=5, history=20):
    """History of allocate+release, then team A's six 3-GPU servers, then team B's 8-GPU one."""
    for i in range(history):
        pool.allocate(f"h{i}", servers(history_gpus))
        pool.release(f"h{i}")
    team_a = [pool.allocate(f"a{i}", servers(3)).node for i in range(6)]
    try:
        pool.allocate("b", servers(8))
    except NoCapacity:
        return team_a, False
    return team_a, True


@pytest.mark.parametrize("seed", range(5))
def test_vdk_scenario_the_8_gpu_server_fits(seed):
    # 7 free GPUs serve one 5-GPU request, not 7 GPUs' worth: team A packs instead of spreading
    team_a, fits = replay_vdk(vdk_pool(seed))
    assert fits, team_a
    assert len(set(team_a)) == 2


@pytest.mark.parametrize("seed", range(5))
def test_vdk_scenario_with_a_declared_profile(seed):
    pool = vdk_pool(seed)
    pool.expect([servers(8)])  # the 8-GPU profile is configured
    assert replay_vdk(pool)[1]


@pytest.mark.parametrize("seed", range(5))
def test_vdk_scenario_as_reported(seed):
    # The paper's measure (every free GPU useful to a 5-GPU type) spreads team A (node-2,0,1,3,2,2 for
    # seed 0) and the 8-GPU server cannot start.
    team_a, fits = replay_vdk(vdk_pool(seed, whole_sets=False))
    assert not fits and len(set(team_a)) == 4
    # Declaring the profile fixes it: the reserve guard keeps one node able to host it...
    assert replay_vdk(vdk_pool(seed, whole_sets=False, expected=[servers(8)]))[1]
    # ...and so does its weight alone, once the floor outweighs the history: packing team A costs
    # (1 - f)·4 GPUs of 5-GPU usefulness, spreading costs f·8 GPUs of 8-GPU usefulness: f > 2/7.
    assert not replay_vdk(vdk_pool(seed, whole_sets=False, expected=[servers(8)], floor_weight=0.2, reserve=0))[1]
    assert replay_vdk(vdk_pool(seed, whole_sets=False, expected=[servers(8)], floor_weight=0.3, reserve=0))[1]


@pytest.mark.parametrize("seed", range(5))
def test_reserve_and_keep_whole_nodes_are_guarantees(seed):
    # With 6-GPU history, spreading team A keeps three nodes able to take a 6-GPU job (packing keeps
    # two): right for that history, so a declared 8-GPU profile only weighing a small floor loses...
    assert not replay_vdk(vdk_pool(seed, expected=[servers(8)], reserve=0), history_gpus=6)[1]
    # ...while the reserve (default 1) or keep_whole_nodes do not weigh, they hold.
    assert replay_vdk(vdk_pool(seed, expected=[servers(8)]), history_gpus=6)[1]
    pool = vdk_pool(seed, keep_whole_nodes={" nvidia a100-SXM4-80GB ": 1})
    team_a, fits = replay_vdk(pool, history_gpus=6)
    assert fits and pool.idle_nodes(A100.casefold()) == 0  # the kept node is the one the 8-GPU server took


def test_keep_whole_nodes_yields_when_nothing_else_fits():
    pool = vdk_pool(keep_whole_nodes=4)
    assert pool.allocate("x", servers(10)).node  # every node is idle and kept: it still goes somewhere


def test_declared_shapes_keep_their_floor():
    policy = get_policy("fgd", learn=True)
    pool = Pool(load_nodes([plain_node("a", 8)]), policy=policy)
    for i in range(8):
        pool.allocate(f"s{i}", Request(gpus=1))
    pool.expect({servers(8): 0.1, servers(4): 0.05})
    weights = {(t[2], t[3]): t[4] for t in policy._types}
    assert weights[(8, 1000)] == pytest.approx(0.1) and weights[(4, 1000)] == pytest.approx(0.05)
    assert weights[(1, 1000)] == pytest.approx(0.85)
    pool.expect([])  # cleared
    assert {(t[2], t[3]) for t in policy._types} == {(1, 1000)}


def test_often_seen_declared_shapes_keep_their_observed_weight():
    from gpupool_hub.placement.mix import RequestMix
    mix = RequestMix()
    for _ in range(70):
        mix.add(servers(1))
    for _ in range(30):
        mix.add(servers(2))
    mix.expect([servers(2), servers(8)], 0.2)
    w = {t[2]: t[4] for t in mix.typical()}
    assert w[8] == pytest.approx(0.2) and w[2] == pytest.approx(0.3 * 0.8) and w[1] == pytest.approx(0.7 * 0.8)
    assert sum(w.values()) == pytest.approx(1.0)
    only = RequestMix()
    only.expect([servers(8), servers(4)], 0.1)  # nothing observed yet: the declared shapes are the mix
    assert {t[2]: t[4] for t in only.typical()} == {8: pytest.approx(0.5), 4: pytest.approx(0.5)}


@pytest.mark.parametrize("shapes, floor, match", [
    ([servers(8)], -0.1, "at least 0 and below 1"),
    ([servers(8)], 1.0, "at least 0 and below 1"),
    ([servers(8), servers(4)], 0.5, "add up to 1"),
    (["8 GPUs"], 0.1, "Request objects"),
    ({servers(8): True}, 0.1, "at least 0 and below 1"),
])
def test_bad_declarations_are_refused(shapes, floor, match):
    for policy in ("fgd", "best-fit"):
        pool = vdk_pool() if policy == "fgd" else Pool(load_nodes([plain_node("a", 2)]), policy=policy)
        with pytest.raises(InvalidRequest, match=match):
            pool.expect(shapes, floor)


def test_keep_whole_nodes_is_validated():
    with pytest.raises(ValueError, match="keep_whole_nodes"):
        get_policy("fgd", keep_whole_nodes=-1)
    with pytest.raises(ValueError, match="keep_whole_nodes"):
        get_policy("fgd", keep_whole_nodes={"A100": "one"})


def test_reserve_guards_against_fractions_too():
    # Node a is the last one with 8 whole GPUs and an 8-GPU profile is declared (guard only, no weight).
    # For a 2-GPU mix, a fraction costs one pair on a or on b alike, so without the guard the seeded node
    # order decides; with it the fraction stays off a. What only a can take still goes to a.
    def pool(seed, reserve):
        policy = get_policy("fgd", workload=[servers(2)] * 10, learn=False, expected=[servers(8)],
                            floor_weight=0, reserve=reserve, seed=seed)
        return Pool(load_nodes([plain_node("a", 8), plain_node("b", 2)]), policy=policy, seed=seed)
    assert {pool(seed, 0).allocate("f", Request(gpu_milli=100)).node for seed in range(8)} == {"a", "b"}
    for seed in range(8):
        guarded = pool(seed, 1)
        assert guarded.allocate("f", Request(gpu_milli=100)).node == "b"
        assert guarded.allocate("big", Request(gpus=4)).node == "a"  # b cannot take it: the guard yields


def test_floor_zero_guards_without_weighing():
    policy = get_policy("fgd", workload=[servers(1)] * 10, learn=False, expected=[servers(8)], floor_weight=0)
    assert {(t[2], t[4]) for t in policy._typical()} == {(1, 1.0)}
    assert policy.reserve == 1 and policy._guarded == ((8, None),)
    with pytest.raises(InvalidRequest, match="reserve"):
        policy.expect([servers(8)], reserve=-1)


@pytest.mark.parametrize("max_slots", [2, 0])  # 0: node size unknown, states keyed by exact CPU and memory
def test_reach_depends_on_the_cpu_left(max_slots):
    from gpupool_hub.placement.fragmentation import FragmentationModel
    model = FragmentationModel([(6000, 0, 1, 500, 1.0, None)], max_slots=max_slots)
    lvl = model.table("x")[2] + 1  # one CPU level up: the type fits
    assert model.useful("x", lvl, 8000, 0, (1000, 500)) == 500      # one copy fits: the tightest device
    assert model.useful("x", lvl, 20000, 0, (1000, 500)) == 1500    # three fit: both devices
    assert FragmentationModel([(6000, 0, 1, 500, 1.0, None)], fraction_reach="largest",
                              max_slots=max_slots).useful("x", lvl, 8000, 0, (1000, 500)) == 1000


def test_a_policy_built_before_its_pool_rebuilds_when_bound():
    policy = get_policy("fgd", workload=[HALF], learn=False)
    Pool(load_nodes([plain_node("a", 2, cpu_milli=14000)]), policy=policy)
    assert policy._model.max_slots == 2
