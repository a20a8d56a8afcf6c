"""A cluster of 4 nodes x 10 GPUs, two teams of 20, and an in-process pool manager."""

from __future__ import annotations

import json

import pytest

from gpupool_hub.reasons import RefusalReason
from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.core.manager import PoolManager
from tests.fixtures.manager import Clock
from tests.fixtures.manager import make_manager as make_core

MODEL = "NVIDIA H100 80GB HBM3"
NODES = [{"name": f"node-{i}", "cpu_milli": 128000, "memory_mib": 1048576, "gpus": {"count": 10, "model": MODEL}}
         for i in range(4)]
TEAMS = {"vision": {"gpus": 20}, "nlp": {"gpus": 20}}
GROUPS = {"vision": ["vision"], "nlp": ["nlp"]}


def make_manager(db: str = "sqlite://", teams=TEAMS, clock=None, **settings) -> PoolManager:
    settings = {"initial_grant": 100000, "preempt_grace": 1, "preempt_min_runtime": 0, **settings}
    return make_core(NODES, {"H100": 1}, db, clock=clock or Clock(), teams=teams, **settings)


def ask(m: PoolManager, user: str, team: str | None, gpus: int, server: str = ""):
    """Admit, finishing a reclaim in-process as the service would after the grace."""
    groups = GROUPS.get(team, [team] if team else [])
    m.clock.advance(1)  # type: ignore[attr-defined]  # one server per second: "newest" is well defined
    try:
        return m.admission.admit(user, groups, server, parse_request({"gpus": gpus}))
    except Refused as e:
        if e.reason != RefusalReason.RECLAIMING:
            raise
    rc = m.reclaims.active[(user, server)]
    m.clock.advance(m.settings.preempt_grace)  # type: ignore[attr-defined]
    for v in rc.victims:
        m.reclaims.preempt(rc, v)
    return m.admission.admit(user, groups, server, parse_request({"gpus": gpus}))


@pytest.fixture
def manager(tmp_path):
    return make_manager(f"sqlite:///{tmp_path / 'ledger.sqlite'}")


def team_hub_config(preempt_grace: float, extra: str = "") -> str:
    """The real-hub tests' configuration: these nodes, two teams of 20, one H100 profile of 1-10 GPUs."""
    return f"""
c.GPUPool.nodes = {json.dumps(NODES)}
c.GPUPool.prices = {{"H100": 1}}
c.GPUPool.initial_grant = 100000
c.GPUPool.teams = {TEAMS!r}
c.GPUPool.preempt_grace = {preempt_grace}
c.GPUPool.preempt_min_runtime = 0
c.GPUPoolSpawner.profiles = [{{"slug": "h100", "display_name": "H100", "gpus": 1, "max_gpus": 10, "models": ["H100"]}}]
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}
c.GPUPoolService.reconcile_interval = 3600
# the wait queue off: these tests check what fair share answers on a full pool (a reclaim, or
# no_capacity where nothing can be taken back); waiting for GPUs is tests/spawner/test_queue_hub.py's
c.GPUPool.queue_enabled = False
""" + extra


def team_hub(tmp_path_factory, name: str, config: str, users_per_team: int):
    """A real hub (``spawner_hub``) with users a0.. in team vision and b0.. in team nlp."""
    from tests.spawner.conftest import spawner_hub

    for hub in spawner_hub(tmp_path_factory, name, config):
        for i in range(users_per_team):
            hub.create_user(f"a{i}", ["vision"])
            hub.create_user(f"b{i}", ["nlp"])
        yield hub


def clear_pool(hub) -> None:
    """After a real-hub test: every server stopped, every allocation released."""
    from tests.spawner.conftest import allocations, stop_everything

    stop_everything(hub)
    for a in allocations(hub):
        hub.service("DELETE", f"/allocations/{a['id']}", hub.spawner_token)
