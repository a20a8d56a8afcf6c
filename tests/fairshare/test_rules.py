"""Table tests of the pure fair-share rules: teams, quotas, classification, victims."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool_hub.fairshare import Holding, Teams, choose_victims, may_preempt, victim_order
from gpupool_hub.placement import Pool, Request

from .conftest import MODEL, NODES

T0 = datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc)
TEAMS = Teams.from_config({"vision": {"gpus": 20}, "nlp": {"gpus": 20}, "ml": {"gpus": 4, "models": {"H100": 2}}})


@pytest.mark.parametrize("config, message", [
    ([], "must be a dict"),
    ({"a": 20}, "c.GPUPool.teams['a'] must be a dict"),
    ({"a": {}}, "needs 'gpus'"),
    ({"a": {"gpus": -1}}, "c.GPUPool.teams['a']['gpus'] must be a non-negative"),
    ({"a": {"gpus": "many"}}, "c.GPUPool.teams['a']['gpus'] must be a number"),
    ({"a": {"gpus": 2, "cpus": 3}}, "unknown key(s) ['cpus']"),
    ({"a": {"models": [1]}}, "['models'] must be a dict"),
    ({"a": {"models": {"A100": True}}}, "c.GPUPool.teams['a']['models']['A100'] must be a number"),
])
def test_bad_team_config_names_the_key(config, message):
    with pytest.raises(ValueError) as e:
        Teams.from_config(config)
    assert message in str(e.value)


def test_config_errors_at_load():
    from traitlets import TraitError
    from traitlets.config import Config

    from gpupool_hub.config import GPUPool

    c = Config()
    c.GPUPool.teams = {"vision": {"gpus": "x"}}
    with pytest.raises(TraitError, match=r"c.GPUPool.teams\['vision'\]\['gpus'\]"):
        GPUPool(config=c)
    c = Config()
    c.GPUPool.preempt_grace = -1
    with pytest.raises(TraitError, match="c.GPUPool.preempt_grace"):
        GPUPool(config=c)


def h(id, team, gpus, borrowed=False, minutes=0, node="node-0", model=MODEL):
    return Holding(id=id, team=team, milli=gpus * 1000, model=model, borrowed=borrowed,
                   created_at=T0 + timedelta(minutes=minutes), node=node)


def test_models_only_quota_totals_its_models():
    t = Teams.from_config({"a": {"models": {"A100": 3, "H100": 2.5}}})
    assert t.quota("a").total == 5500


@pytest.mark.parametrize("groups, usage, team", [
    ([], {}, "default"),                                 # in no team: the default team
    (["students"], {}, "default"),                        # groups that are not teams do not count
    (["vision"], {}, "vision"),
    (["vision", "nlp"], {}, "nlp"),                       # equal headroom: first name
    (["vision", "nlp"], {"nlp": 5}, "vision"),            # the most headroom left
    (["vision", "nlp"], {"vision": 25, "nlp": 21}, "nlp"),
])
def test_team_resolution(groups, usage, team):
    u = TEAMS.usage([h(f"x{k}", k, n) for k, n in usage.items()])
    assert TEAMS.resolve(groups, u) == team


@pytest.mark.parametrize("team, held, ask, model, kind", [
    ("vision", 0, 8, MODEL, "guaranteed"),
    ("vision", 12, 8, MODEL, "guaranteed"),     # exactly the quota
    ("vision", 13, 8, MODEL, "borrowed"),
    ("default", 0, 1, MODEL, "borrowed"),       # the default team has no quota unless configured
    ("ml", 0, 2, MODEL, "guaranteed"),          # within the per-model quota
    ("ml", 0, 3, MODEL, "borrowed"),            # beyond the H100 quota although within the total
    ("ml", 0, 3, "NVIDIA RTX A6000", "guaranteed"),  # other models: the total alone
])
def test_classify(team, held, ask, model, kind):
    u = TEAMS.usage([h("held", team, held)] if held else [])
    assert TEAMS.classify(team, ask * 1000, model, u) == kind


def test_victim_order_most_over_quota_team_first_then_newest():
    hs = [h("v-old", "vision", 20), h("v1", "vision", 2, True, 1), h("v2", "vision", 2, True, 5),
          h("d1", "default", 1, True, 9), h("n", "nlp", 10)]
    u = TEAMS.usage(hs)  # vision over by 4, default over by 1, nlp under
    assert [x.id for x in victim_order(TEAMS, "nlp", 4000, hs, u)] == ["v2", "v1", "d1"]
    # a team over quota after its placement cannot preempt a team less over quota than that
    assert [x.id for x in victim_order(TEAMS, "nlp", 13000, hs, u)] == ["v2", "v1"]


def pool_with(placements):
    """A pool (first-fit, 4 x 10) holding ``[(id, node index, gpus)]``; returns it and a node map."""
    pool = Pool(NODES, policy="first-fit")
    for alloc_id, node, gpus in placements:
        before = {n: pool.nodes[n].n_full for n in range(4)}
        # fill exactly the given node: first-fit takes the first node with room
        for other in range(node):
            if pool.nodes[other].n_full:
                pool.allocate(f"pad-{alloc_id}-{other}", Request(gpus=pool.nodes[other].n_full))
        pool.allocate(alloc_id, Request(gpus=gpus))
        for other in range(node):
            if f"pad-{alloc_id}-{other}" in pool:
                pool.release(f"pad-{alloc_id}-{other}")
        assert pool.get(alloc_id).node == f"node-{node}", (before, alloc_id)
    return pool


def test_victims_fit_the_request_on_one_node_and_free_only_what_it_needs():
    # vision: 20 guaranteed on node-0/1, borrowed 3+3+2+2 spread over node-2 and node-3;
    # nlp: 6 on node-2 and 4 on node-3. Every GPU is taken.
    spec = [("g0", 0, 10, False, 0), ("g1", 1, 10, False, 0),
            ("b1", 2, 2, True, 1), ("b2", 3, 3, True, 2), ("b3", 2, 2, True, 3), ("b4", 3, 3, True, 4),
            ("n1", 2, 6, False, 0), ("n2", 3, 4, False, 0)]
    pool = pool_with([(i, node, g) for i, node, g, _, _ in spec])
    hs = [h(i, "vision" if i[0] in "gb" else "nlp", g, b, t, f"node-{node}") for i, node, g, b, t in spec]
    u = TEAMS.usage(hs)
    before = pool.snapshot()
    # nlp (10 held) asks for 4: node-2 would need both 2-GPU servers, node-3 one 3-GPU
    # server frees only 3: so node-2, b3 and b1 (4 GPUs), never more
    v = choose_victims(pool, Request(gpus=4), TEAMS, "nlp", hs, u)
    assert sorted(x.id for x in v) == ["b1", "b3"]
    assert pool.snapshot() == before  # the trial left the pool as it was
    # asks for 3: the newest 3-GPU server alone is enough
    v = choose_victims(pool, Request(gpus=3), TEAMS, "nlp", hs, u)
    assert [x.id for x in v] == ["b4"]
    # 2: one server of 2, the newest
    assert [x.id for x in choose_victims(pool, Request(gpus=2), TEAMS, "nlp", hs, u)] == ["b3"]
    # 6: both borrowed servers of node-3
    assert sorted(x.id for x in choose_victims(pool, Request(gpus=6), TEAMS, "nlp", hs, u)) == ["b2", "b4"]
    # 7 fits no node without preempting guaranteed servers: nothing is preempted
    assert choose_victims(pool, Request(gpus=7), TEAMS, "nlp", hs, u) is None
    assert pool.snapshot() == before


def test_never_below_quota_and_never_guaranteed():
    spec = [("g0", 0, 10, False, 0), ("g1", 1, 9, False, 0), ("b1", 1, 1, False, 0),
            ("b2", 2, 3, True, 1), ("n", 3, 10, False, 0), ("n2", 2, 7, False, 0)]
    pool = pool_with([(i, node, g) for i, node, g, _, _ in spec])
    hs = [h(i, "nlp" if i[0] == "n" else "vision", g, b, t, f"node-{node}") for i, node, g, b, t in spec]
    u = TEAMS.usage(hs)  # vision 23 (over by 3), nlp 17
    assert [x.id for x in choose_victims(pool, Request(gpus=3), TEAMS, "nlp", hs, u)] == ["b2"]
    # vision is over by 3 only: a 3-GPU request of nlp... fine, but with vision over by 2 nothing goes
    hs2 = [x if x.id != "g0" else h("g0", "vision", 9, False, 0, "node-0") for x in hs]
    u2 = TEAMS.usage(hs2)
    assert TEAMS.overage("vision", u2) == 2000
    assert choose_victims(pool, Request(gpus=3), TEAMS, "nlp", hs2, u2) is None


def test_may_preempt():
    u = TEAMS.usage([h("a", "nlp", 18)])
    assert may_preempt(TEAMS, "nlp", 2000, u, T0, {})
    assert not may_preempt(TEAMS, "nlp", 3000, u, T0, {})            # would be over quota
    assert not may_preempt(TEAMS, "nlp", 1000, u, T0, {"nlp": T0 + timedelta(seconds=1)})  # cooling down
    assert may_preempt(TEAMS, "nlp", 1000, u, T0 + timedelta(seconds=1), {"nlp": T0 + timedelta(seconds=1)})
    assert not may_preempt(TEAMS, "ml", 3000, TEAMS.usage([]), T0, {}, [MODEL])  # H100 quota is 2
