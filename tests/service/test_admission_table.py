"""Admission as a table: one runner, named cases on one small two-model pool
(the go-gpuallocator habit). Each case: the user's balance, what they already
hold, what they ask for, and what the pool must answer."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpupool_hub.placement import Request
from gpupool_hub.reasons import RefusalReason
from gpupool_hub.service.core.errors import BadRequest, Refused
from tests.fixtures.manager import Clock, make_manager

R3090, A6000 = "NVIDIA GeForce RTX 3090", "NVIDIA RTX A6000"
NODES = [
    {"name": "node-3090", "cpu_milli": 32000, "memory_mib": 131072,
     "gpus": [{"index": i, "uuid": f"GPU-3090-{i}", "model": R3090} for i in range(4)],
     "links": [{"gpus": [0, 1], "nvlinks": 4}, {"gpus": [2, 3], "nvlinks": 4}]},
    {"name": "node-a6000", "cpu_milli": 32000, "memory_mib": 131072,
     "gpus": [{"index": i, "uuid": f"GPU-A6000-{i}", "model": A6000} for i in range(2)]},
]
PRICES = {"RTX 3090": 1, "RTX A6000": 4}


@dataclass
class Case:
    name: str
    grant: int
    ask: Request
    models: list[str] | None = None
    held: list[tuple[str, Request, list[str] | None]] = field(default_factory=list)  # (server, request, models)
    server: str = "new"
    node: str | None = None  # placed on this node ...
    gpus: tuple[int, ...] | None = None  # ... on these GPU indices
    refused: RefusalReason | None = None
    bad: bool = False
    same_as_held: bool = False


CASES = [
    Case("one GPU of any model", 10, Request(gpus=1), node="node-3090"),
    Case("two GPUs go to an NVLink pair", 10, Request(gpus=2), node="node-3090", gpus=(0, 1)),
    Case("the dear model only, affordable", 10, Request(gpus=1), [A6000], node="node-a6000"),
    Case("the dear model only, unaffordable", 3, Request(gpus=1), ["RTX A6000"],
         refused=RefusalReason.INSUFFICIENT_BALANCE),
    Case("either model: the affordable one is taken", 3, Request(gpus=1), ["RTX A6000", "RTX 3090"],
         node="node-3090"),
    Case("a model the pool does not have", 100, Request(gpus=1), ["V100"], refused=RefusalReason.MODEL_UNAVAILABLE),
    Case("more GPUs than any node has", 100, Request(gpus=5), refused=RefusalReason.MODEL_UNAVAILABLE),
    Case("every GPU of the model held", 100, Request(gpus=1), ["RTX 3090"],
         held=[("a", Request(gpus=2), ["RTX 3090"]), ("b", Request(gpus=2), ["RTX 3090"])],
         refused=RefusalReason.NO_CAPACITY),
    Case("the pair left free after another server", 100, Request(gpus=2), ["RTX 3090"],
         held=[("a", Request(gpus=2), ["RTX 3090"])], node="node-3090", gpus=(2, 3)),
    Case("a share of a GPU", 10, Request(gpu_milli=500), ["RTX 3090"], node="node-3090"),
    Case("a retry of a held server gets the same GPUs", 100, Request(gpus=1), held=[("new", Request(gpus=1), None)],
         same_as_held=True),
    Case("a request without GPUs", 100, Request(cpu_milli=1000), bad=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_admission(case: Case) -> None:
    m = make_manager(NODES, PRICES, clock=Clock(), initial_grant=case.grant, floor=0, daily_credit=0,
                     monthly_credit=0)
    held = [m.admission.admit("alice", [], server, req, models) for server, req, models in case.held]
    if case.bad:
        with pytest.raises(BadRequest):
            m.admission.admit("alice", [], case.server, case.ask, case.models)
        return
    if case.refused is not None:
        with pytest.raises(Refused) as refusal:
            m.admission.admit("alice", [], case.server, case.ask, case.models)
        assert refusal.value.reason is case.refused, refusal.value.message
        assert len(m.pool) == len(held)  # a refusal holds nothing
        return
    record = m.admission.admit("alice", [], case.server, case.ask, case.models)
    if case.same_as_held:
        assert record.id == held[0].id and len(m.ledger.allocations.active("alice")) == 1
        return
    assert record.node == case.node
    if case.gpus is not None:
        assert tuple(g["index"] for g in record.gpus) == case.gpus
    assert record.id in m.pool and m.ledger.allocations.get(record.id) is not None


# Issue 12, item 2: a new server must be affordable together with those already held.
CASES_12_2 = [
    Case("a second server needs the first one's price too", 150, Request(gpus=1), ["RTX 3090"],
         held=[("a", Request(gpus=1), ["RTX 3090"])], refused=RefusalReason.INSUFFICIENT_BALANCE),
    Case("two held servers, the third fits exactly", 300, Request(gpus=1), ["RTX 3090"],
         held=[("a", Request(gpus=1), ["RTX 3090"]), ("b", Request(gpus=1), ["RTX 3090"])], node="node-3090"),
    Case("a held share counts by its price", 300, Request(gpus=1), ["RTX 3090"],
         held=[("a", Request(gpu_milli=500), ["RTX A6000"])], node="node-3090"),
    Case("with a share held, the dear model no longer fits", 300, Request(gpu_milli=500), ["RTX A6000"],
         held=[("a", Request(gpu_milli=500), ["RTX A6000"])], refused=RefusalReason.INSUFFICIENT_BALANCE),
    Case("held servers leave the cheaper model", 600, Request(gpus=1), ["RTX A6000", "RTX 3090"],
         held=[("a", Request(gpus=1), ["RTX A6000"])], node="node-3090"),
]


@pytest.mark.parametrize("case", CASES_12_2, ids=[c.name for c in CASES_12_2])
def test_12_2_start_check_counts_held_servers(case: Case) -> None:
    """``grant`` is in hundredths of a token here; the floor is 0 and min_start_hours 1."""
    from decimal import Decimal

    m = make_manager(NODES, PRICES, clock=Clock(), initial_grant=Decimal(case.grant) / 100, floor=0,
                     daily_credit=0, monthly_credit=0)
    held = [m.admission.admit("alice", [], server, req, models) for server, req, models in case.held]
    if case.refused is not None:
        with pytest.raises(Refused) as refusal:
            m.admission.admit("alice", [], case.server, case.ask, case.models)
        assert refusal.value.reason is case.refused, refusal.value.message
        assert len(m.pool) == len(held)
        # the refusal says what is held and what it costs
        assert all(f"{r.server} ({r.price_per_hour.normalize():f}/h)" in refusal.value.message for r in held)
        assert refusal.value.details["held"] == [{"server": r.server, "price_per_hour": f"{r.price_per_hour:.3f}"}
                                                 for r in held]
        return
    record = m.admission.admit("alice", [], case.server, case.ask, case.models)
    assert record.node == case.node
