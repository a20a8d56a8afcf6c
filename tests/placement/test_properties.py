"""Property tests: random allocate/release sequences never break the invariants."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool_hub.placement import MILLI, NoCapacity, ModelUnavailable, Pool, Request, get_policy, load_nodes
from gpupool_hub.placement.request import normalize_model

from .conftest import dgx1v_node, plain_node, rtx4_node

MODELS = ["NVIDIA GeForce RTX 3090", "Tesla V100-SXM2-32GB", "Quadro RTX 8000", "NVIDIA A100-SXM4-80GB"]


def make_nodes():
    return load_nodes([
        dgx1v_node("dgx", cpu_milli=40000, memory_mib=65536),
        rtx4_node("box"),
        plain_node("p2", 2, MODELS[0], cpu_milli=8000, memory_mib=32768),
        plain_node("p8", 8, MODELS[0], cpu_milli=24000, memory_mib=65536),
        {"name": "mig", "cpu_milli": 16000, "memory_mib": 65536, "gpus": [
            {"index": 0, "model": MODELS[3], "mig": [{"profile": "1g.10gb"}, {"profile": "2g.20gb"}, {"profile": "3g.40gb"}]},
            {"index": 1, "model": MODELS[3]}]},
    ])


requests = st.builds(
    lambda cpu, mem, kind, gpus, milli, models: Request(
        cpu_milli=cpu, memory_mib=mem,
        gpus=gpus if kind == "whole" else 0,
        gpu_milli=milli if kind == "frac" else 0,
        models=models),
    st.integers(0, 20000), st.integers(0, 40000),
    st.sampled_from(["none", "whole", "frac"]), st.integers(1, 8), st.integers(1, 999),
    st.one_of(st.none(), st.frozensets(st.sampled_from(MODELS), min_size=1, max_size=2)),
)

ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), requests),
    st.tuples(st.just("release"), st.integers(0, 10 ** 6)),
), min_size=1, max_size=60)


def check_invariants(pool: Pool, live: dict) -> None:
    total_alloc = 0
    for ns in pool.nodes:
        n = ns.node
        cpu = sum(p.cpu_milli for p in live.values() if p.node == n.name)
        mem = sum(p.memory_mib for p in live.values() if p.node == n.name)
        assert 0 <= cpu <= n.cpu_milli and ns.cpu_free == n.cpu_milli - cpu
        assert 0 <= mem <= n.memory_mib and ns.mem_free == n.memory_mib - mem
        for s in range(len(ns.free)):
            used = sum(ns.holders[s].values())
            assert 0 <= used <= ns.cap[s] <= MILLI, "over-committed device"
            assert ns.free[s] == ns.cap[s] - used
            if ns.slot_mig[s] is not None:
                assert len(ns.holders[s]) <= 1, "MIG instance shared"
            total_alloc += used
        # incremental aggregates equal a full recomputation
        assert ns.n_full == sum(1 for s, f in enumerate(ns.free) if f == MILLI and ns.whole[s])
        assert ns.total_free == sum(ns.free) and ns.max_free == max(ns.free, default=0)
    assert total_alloc == pool.allocated_gpu_milli
    # the O(1) per-model counters equal a recount
    for mk in {ns.model_key for ns in pool.nodes}:
        same = [ns for ns in pool.nodes if ns.model_key == mk]
        assert pool.idle_nodes(mk) == sum(1 for ns in same if ns.cap_total and ns.total_free == ns.cap_total)
        for k in range(1, 9):
            assert pool.nodes_with_whole(k, frozenset({mk})) == sum(1 for ns in same if ns.n_full >= k)
    for snap in pool.snapshot():
        for g in snap["gpus"]:
            assert g["allocated_milli"] <= MILLI  # fractions on one GPU never sum above 1
    # the admin map's one-pass summary equals a recount from the snapshot and the placements
    per_model, by_alloc = pool.held_per_model()
    snap = pool.snapshot()
    for model, e in per_model.items():
        gpus = [g for n in snap for g in n["gpus"] if g["model"] == model]
        assert e["gpus"] == len(gpus) and e["held_milli"] == sum(g["allocated_milli"] for g in gpus)
        assert e["nodes"] == sum(1 for n in snap if any(g["model"] == model for g in n["gpus"]))
        assert e["mig_gpus"] == sum(1 for g in gpus if g.get("mig"))
    charged: dict[str, int] = {}  # what each holds of its devices (a MIG instance: all of it)
    for ns in pool.nodes:
        for held in ns.holders:
            for a, milli in held.items():
                charged[a] = charged.get(a, 0) + milli
    assert by_alloc == charged and set(by_alloc) == {a for a, p in live.items() if p.gpus}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["fgd", "best-fit", "first-fit", "random"]), ops=ops)
def test_random_sequences_keep_invariants(policy, ops):
    pool = Pool(make_nodes(), policy=get_policy(policy), seed=3)
    empty = pool.snapshot()
    live = {}
    states = {}
    counter = 0
    for op, arg in ops:
        if op == "alloc":
            aid = f"a{counter}"
            counter += 1
            before = pool.snapshot()
            try:
                p = pool.allocate(aid, arg)
            except (NoCapacity, ModelUnavailable):
                assert pool.snapshot() == before  # a refusal changes nothing
                continue
            live[aid] = p
            states[aid] = before
            node = next(ns for ns in pool.nodes if ns.name == p.node)
            if arg.models is not None:
                assert all(normalize_model(g.model) in arg.models for g in p.gpus)
            if arg.gpu_milli:
                assert len(p.gpus) == 1 and p.gpus[0].milli == arg.gpu_milli
            else:
                assert len(p.gpus) == arg.gpus and len({g.index for g in p.gpus}) == arg.gpus
                assert all(g.mig_uuid is None for g in p.gpus)
            assert node.cpu_free >= 0 and node.mem_free >= 0
            # release right away restores the exact state, then re-apply via restore
            pool.release(aid)
            assert pool.snapshot() == before
            pool.restore(aid, p)
        elif live:
            aid = sorted(live)[arg % len(live)]
            pool.release(aid)
            del live[aid]
        check_invariants(pool, live)
    for aid in list(live):
        pool.release(aid)
    assert pool.snapshot() == empty
    assert pool.allocated_gpu_milli == 0


@settings(max_examples=25, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=40), seed=st.integers(0, 5))
def test_deterministic(reqs, seed):
    def run():
        pool = Pool(make_nodes(), policy=get_policy("fgd"), seed=seed)
        out = []
        for i, r in enumerate(reqs):
            try:
                out.append(pool.allocate(str(i), r))
            except (NoCapacity, ModelUnavailable) as e:
                out.append(type(e).__name__)
        return out

    assert run() == run()


@settings(max_examples=40, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=30))
def test_refusal_kind_is_right(reqs):
    """ModelUnavailable exactly when the request cannot fit the *empty* pool."""
    pool = Pool(make_nodes(), policy=get_policy("best-fit"))
    for i, r in enumerate(reqs):
        try:
            pool.allocate(str(i), r)
        except ModelUnavailable:
            empty = Pool(make_nodes(), policy=get_policy("best-fit"))
            try:
                empty.allocate("probe", r)
                raise AssertionError("ModelUnavailable for a request an empty pool can take")
            except ModelUnavailable:
                pass
        except NoCapacity:
            empty = Pool(make_nodes(), policy=get_policy("best-fit"))
            empty.allocate("probe", r)  # must fit an empty pool
