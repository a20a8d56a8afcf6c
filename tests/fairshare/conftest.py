"""A cluster of 4 nodes x 10 GPUs, two teams of 20, and an in-process pool manager."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from traitlets.config import Config

from gpupool_hub.config import GPUPool
from gpupool_hub.ledger import Ledger
from gpupool_hub.service.manager import PoolManager, Refused, parse_request
from gpupool_hub.usage.records import AllocationRecordsSource

MODEL = "NVIDIA H100 80GB HBM3"
NODES = [{"name": f"node-{i}", "cpu_milli": 128000, "memory_mib": 1048576, "gpus": {"count": 10, "model": MODEL}}
         for i in range(4)]
TEAMS = {"vision": {"gpus": 20}, "nlp": {"gpus": 20}}
GROUPS = {"vision": ["vision"], "nlp": ["nlp"]}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def make_manager(db: str = "sqlite://", teams=TEAMS, clock=None, **settings) -> PoolManager:
    c = Config()
    c.GPUPool.prices = {"H100": 1}
    c.GPUPool.nodes = NODES
    c.GPUPool.teams = teams
    c.GPUPool.initial_grant = 100000
    c.GPUPool.preempt_grace = 1
    for k, v in settings.items():
        setattr(c.GPUPool, k, v)
    gp = GPUPool(config=c)
    ledger = Ledger(db)
    clock = clock or Clock(datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc))
    return PoolManager(settings=gp, ledger=ledger, pool=gp.make_pool(), usage_source=AllocationRecordsSource(ledger),
                       clock=clock)


def ask(m: PoolManager, user: str, team: str | None, gpus: int, server: str = ""):
    """Admit, finishing a reclaim in-process as the service would after the grace."""
    groups = GROUPS.get(team, [team] if team else [])
    m.clock.advance(1)  # type: ignore[attr-defined]  # one server per second: "newest" is well defined
    try:
        return m.admit(user, groups, server, parse_request({"gpus": gpus}))
    except Refused as e:
        if e.reason != "reclaiming":
            raise
    rc = m.reclaims[(user, server)]
    m.clock.advance(m.settings.preempt_grace)  # type: ignore[attr-defined]
    for v in rc.victims:
        m.preempt(rc, v)
    return m.admit(user, groups, server, parse_request({"gpus": gpus}))


@pytest.fixture
def manager(tmp_path):
    return make_manager(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
