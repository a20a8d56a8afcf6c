"""Required and preferred devices (go-gpuallocator's required devices), table-tested on real topologies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.placement_pick import two_cube_meshes
from gpupool_hub.placement import (
    GPUShare, InvalidRequest, ModelUnavailable, NoCapacity, Placement, Pool, Request, get_policy, load_nodes,
)

from .conftest import dgx1v_node, plain_node

POLICIES = ["fgd", "best-fit", "first-fit", "random"]


def uuid(node: str, i: int) -> str:
    return f"GPU-{node}-{i}"


def busy(pool: Pool, node: str, gpus) -> None:
    n = pool.by_name[node].node
    if gpus:
        pool.restore("busy", Placement(node=node, gpus=tuple(
            GPUShare(g, n.gpus[g].uuid, n.gpus[g].model, 1000) for g in gpus)))


def indices(p: Placement):
    return tuple(sorted(g.index for g in p.gpus))


# name, busy GPUs, k, required, preferred, expected GPU set
DGX1V_CASES = [
    ("one required GPU is the set", (), 1, {5}, (), (5,)),
    ("required GPU gets a partner that keeps the rest pairable", (), 2, {0}, (), (0, 4)),  # 0-3 leaves six GPUs that pair less well
    ("two required GPUs are taken as they are", (), 2, {0, 7}, (), (0, 7)),  # even if poorly connected
    ("a required GPU pulls in its quad", (), 4, {1}, (), (0, 1, 2, 3)),
    ("a required GPU in a partly busy node", (3,), 2, {0}, (), (0, 4)),     # 0-3 busy: the other double link
    ("preferred pair is taken", (), 2, (), {6, 7}, (6, 7)),
    ("preferred GPUs come first even if far apart", (), 2, (), {0, 5}, (0, 5)),
    ("too many preferred: the best-connected of them", (), 2, (), {0, 1, 2, 3, 4}, (2, 3)),
    ("busy preferred GPUs are skipped", (6,), 2, (), {6, 7}, (4, 7)),       # 7's double link to 4
    ("required and preferred together", (), 3, {0}, {3}, (0, 2, 3)),        # 2 is double-linked to 3
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name, held, k, required, preferred, want", DGX1V_CASES, ids=[c[0] for c in DGX1V_CASES])
def test_dgx1v_pins(policy, name, held, k, required, preferred, want):
    pool = Pool(load_nodes([dgx1v_node()]), policy=get_policy(policy))
    busy(pool, "dgx1", held)
    req = Request(gpus=k, required=frozenset(uuid("dgx1", g) for g in required),
                  preferred=frozenset(uuid("dgx1", g) for g in preferred))
    assert indices(pool.allocate("x", req)) == want


CUBE_CASES = [
    ("required GPU on the second board pulls in its quad", 4, {8}, (), (8, 9, 10, 11)),
    ("required GPUs across boards are honoured", 2, {0, 8}, (), (0, 8)),
    ("preferred GPU gets a double-NVLinked partner", 2, (), {13}, (9, 13)),  # 13-14 too, but 9-13 leaves better pairs
    ("eight with one required stays on its board", 8, {12}, (), tuple(range(8, 16))),
]


@pytest.mark.parametrize("name, k, required, preferred, want", CUBE_CASES, ids=[c[0] for c in CUBE_CASES])
def test_sixteen_gpu_pins(name, k, required, preferred, want):
    node = two_cube_meshes("hgx")
    pool = Pool([node])
    req = Request(gpus=k, required=frozenset(node.gpus[g].uuid for g in required),
                  preferred=frozenset(node.gpus[g].uuid for g in preferred))
    assert indices(pool.allocate("x", req)) == want


def two_nodes(policy="fgd"):
    return Pool(load_nodes([dgx1v_node("a"), dgx1v_node("b")]), policy=get_policy(policy))


@pytest.mark.parametrize("policy", POLICIES)
def test_required_devices_pin_the_node(policy):
    pool = two_nodes(policy)
    for i in range(3):
        assert pool.allocate(f"x{i}", Request(gpus=1, required=frozenset({uuid("b", i)}))).node == "b"


@pytest.mark.parametrize("policy", POLICIES)
def test_preferred_devices_choose_the_node_when_free(policy):
    pool = two_nodes(policy)
    p = pool.allocate("x", Request(gpus=2, preferred=frozenset({uuid("b", 6), uuid("a", 1), uuid("b", 7)})))
    assert p.node == "b" and indices(p) == (6, 7)  # b holds two of them, a only one
    q = pool.allocate("y", Request(gpus=2, preferred=frozenset({uuid("b", 6)})))  # busy now: any node
    assert 6 not in indices(q) or q.node == "a"


def test_preferred_puts_a_server_back_on_its_gpus():
    pool = two_nodes()
    first = pool.allocate("x", Request(cpu_milli=4000, gpus=3))
    pool.release("x")
    other = "b" if first.node == "a" else "a"
    pool.allocate("y", Request(gpus=1, required=frozenset({uuid(other, 0)})))  # the other node is now the better fit
    again = pool.allocate("x", Request(cpu_milli=4000, gpus=3, preferred=frozenset(g.uuid for g in first.gpus)))
    assert (again.node, indices(again)) == (first.node, indices(first))


def test_required_refusals_say_why():
    pool = Pool(load_nodes([dgx1v_node("a"), dgx1v_node("b"), plain_node("r", 2)]))
    pool.allocate("hold", Request(gpus=1, required=frozenset({uuid("a", 0)})))
    with pytest.raises(NoCapacity):
        pool.allocate("x", Request(gpus=2, required=frozenset({uuid("a", 0)})))   # busy now
    with pytest.raises(ModelUnavailable, match="GPU-nope"):
        pool.allocate("x", Request(gpus=1, required=frozenset({"GPU-nope"})))
    with pytest.raises(ModelUnavailable, match="not all on one node"):
        pool.allocate("x", Request(gpus=2, required=frozenset({uuid("a", 1), uuid("b", 1)})))
    with pytest.raises(ModelUnavailable, match="allowed models"):
        pool.allocate("x", Request(gpus=1, models=frozenset({"Tesla V100-SXM2-32GB"}), required=frozenset({"r/gpu0"})))
    assert "x" not in pool


def test_request_validation_of_pins():
    with pytest.raises(InvalidRequest, match="required devices"):
        Request(gpus=1, required=frozenset({"a", "b"}))
    with pytest.raises(InvalidRequest, match="required devices"):
        Request(gpu_milli=500, required=frozenset({"a", "b"}))
    with pytest.raises(InvalidRequest, match="without GPUs"):
        Request(cpu_milli=1000, preferred=frozenset({"a"}))
    with pytest.raises(InvalidRequest, match="UUID"):
        Request(gpus=1, required=frozenset({""}))
    r = Request(gpus=2, required="GPU-x", preferred={"GPU-x", "GPU-y"})
    assert r.required == frozenset({"GPU-x"}) and r.preferred == frozenset({"GPU-y"})


MIG = "NVIDIA A100-SXM4-80GB"


def mig_pool():
    return Pool(load_nodes([
        {"name": "m", "cpu_milli": 8000, "memory_mib": 65536, "gpus": [
            {"index": 0, "uuid": "GPU-m0", "model": MIG,
             "mig": [{"uuid": "MIG-a", "profile": "1g.10gb"}, {"uuid": "MIG-b", "profile": "3g.40gb"}]},
            {"index": 1, "uuid": "GPU-m1", "model": MIG}]},
        plain_node("p", 2, MIG)]))


def test_fraction_pins():
    pool = mig_pool()
    # a required plain GPU wins over the tighter MIG instance
    assert pool.allocate("a", Request(gpu_milli=100, required=frozenset({"GPU-m1"}))).gpus[0].index == 1
    # naming the MIG GPU lets the fraction take any of its instances (the tightest free one)
    assert pool.allocate("b", Request(gpu_milli=100, required=frozenset({"GPU-m0"}))).gpus[0].mig_uuid == "MIG-a"
    assert pool.allocate("c", Request(gpu_milli=100, required=frozenset({"GPU-m0"}))).gpus[0].mig_uuid == "MIG-b"
    with pytest.raises(NoCapacity):
        pool.allocate("d", Request(gpu_milli=100, required=frozenset({"MIG-a"})))  # instances go whole
    with pytest.raises(ModelUnavailable, match="MIG GPU"):
        pool.allocate("e", Request(gpus=1, required=frozenset({"GPU-m0"})))
    with pytest.raises(ModelUnavailable, match="smaller"):
        pool.allocate("f", Request(gpu_milli=500, required=frozenset({"MIG-a"})))
    pref = pool.allocate("g", Request(gpu_milli=300, preferred=frozenset({"p/gpu1"})))
    assert (pref.node, pref.gpus[0].index) == ("p", 1)


UUIDS = [uuid(n, i) for n in ("a", "b") for i in range(8)] + ["GPU-nope"]


@settings(max_examples=60, deadline=None)
@given(reqs=st.lists(st.builds(
    lambda k, frac, req, pref: Request(gpus=0 if frac else k, gpu_milli=frac,
                                       required=frozenset(req[: (1 if frac else k)]), preferred=frozenset(pref)),
    st.integers(1, 4), st.sampled_from([0, 0, 250, 600]),
    st.lists(st.sampled_from(UUIDS), max_size=3, unique=True),
    st.lists(st.sampled_from(UUIDS), max_size=3, unique=True)), min_size=1, max_size=25))
def test_pins_are_honoured_or_refused_for_the_right_reason(reqs):
    pool = two_nodes()
    for i, r in enumerate(reqs):
        try:
            p = pool.allocate(str(i), r)
        except ModelUnavailable:
            with pytest.raises(ModelUnavailable):
                two_nodes().allocate("probe", r)
            continue
        except NoCapacity:
            two_nodes().allocate("probe", r)  # an empty pool takes it
            continue
        got = {g.uuid for g in p.gpus}
        assert r.required <= got
        assert len(p.gpus) == (1 if r.gpu_milli else r.gpus)
