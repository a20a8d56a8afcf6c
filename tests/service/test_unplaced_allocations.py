"""A server whose GPUs the pool lacks at start-up keeps its allocation (issue 37.7c).

The case reported: a Slurm GRES type missing from ``c.GPUPool.slurm_gpu_models``
when the service starts while a server runs on a GPU of that type. The service
released the allocation; once the map was fixed and the hub restarted, the GPU
(busy in Slurm, held by no allocation) showed as "held outside the hub", and the
reconcile job logged an ERROR at every run for a server holding an allocation
the pool did not know.

The service core runs here as ``GPUPoolService.initialize`` builds it (restore,
then the source's first node status), over a SQLite ledger file that outlives
each "restart". Slurm's answers are scripted at its one seam, the runner of
``SlurmInventory`` (the batchspawner habit), with ``scontrol`` output captured
from a real cluster (``tests/slurm/data``), marked busy where the test's
server runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpupool_hub.inventory.agents import AgentInventory
from gpupool_hub.inventory.sources import ConfigInventory
from gpupool_hub.placement import Request
from gpupool_hub.placement.hardware import load_node
from gpupool_hub.service.core.manager import PoolManager
from gpupool_hub.engines.slurm.inventory import SlurmInventory, SlurmInventorySource
from tests.fixtures.manager import Clock, make_manager

DATA = Path(__file__).parents[1] / "slurm" / "data"
R3090 = "NVIDIA GeForce RTX 3090"
FULL_MAP = {"a6000": "NVIDIA RTX A6000", "rtx3090": R3090}
BROKEN_MAP = {"a6000": "NVIDIA RTX A6000"}  # the admin's typo: rtx3090 is left out
PRICES = {"RTX A6000": 4, "RTX 3090": 1}


class Scontrol:
    """``scontrol --details show node --oneliner`` as a real cluster printed it (all idle),
    with the GPUs the test's jobs hold marked in use, as Slurm's ``GresUsed`` shows them."""

    def __init__(self) -> None:
        self.text = (DATA / "nodes_idle.txt").read_text()

    def busy(self, node: str, gres_type: str, index: int) -> None:
        lines = self.text.split("\n")
        for n, line in enumerate(lines):
            if line.startswith(f"NodeName={node} "):
                lines[n] = line.replace(f"gpu:{gres_type}:0(IDX:N/A)", f"gpu:{gres_type}:1(IDX:{index})")
                assert lines[n] != line, f"{node} has no idle {gres_type} in the captured output"
        self.text = "\n".join(lines)

    def __call__(self, argv: Sequence[str]) -> str:
        assert list(argv[:4]) == ["scontrol", "--details", "show", "node"], argv
        return self.text


def start(db: str, models: dict[str, str], scontrol: Scontrol,
          clock: Clock) -> tuple[PoolManager, SlurmInventorySource]:
    """The service's start-up with ``c.GPUPool.inventory = "slurm"`` (``app.initialize``)."""
    source = SlurmInventorySource(models, inventory=SlurmInventory(models, runner=scontrol, skip_unmapped=True))
    m = make_manager([], PRICES, db, clock=clock, source=source, slurm_gpu_models=models)
    m.restore()
    m.inventory.apply_node_status(source.node_status())
    return m, source


def pool_map(m: PoolManager) -> list[dict]:
    """What ``GET pool`` (``gpupool pool``) shows."""
    return m.views.pool_report(m.ledger.allocations.active_holders(), {})["nodes"]


def gpu_of(nodes: list[dict], node: str, index: int) -> dict:
    return next(g for n in nodes if n["node"] == node for g in n["gpus"] if g["index"] == index)


def problems(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and r.name.startswith("gpupool")]


def test_a_server_on_an_unmapped_gres_type_keeps_its_gpu_until_the_map_is_fixed(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    db, clock, scontrol = f"sqlite:///{tmp_path / 'ledger.sqlite'}", Clock(), Scontrol()
    m, _ = start(db, FULL_MAP, scontrol, clock)
    alloc = m.admission.admit("alice", [], "train", Request(gpus=1), ["RTX 3090"])
    gpu = alloc.gpus[0]
    scontrol.busy(alloc.node, "rtx3090", gpu["index"])  # her job runs on it
    m.close()

    # restart with the type left out of the map: the service starts, her allocation stays held
    caplog.clear()
    clock.advance(60)
    m, source = start(db, BROKEN_MAP, scontrol, clock)
    held = m.ledger.allocations.get(alloc.id)
    assert held is not None and held.released_at is None, held
    assert alloc.id in {r.id for r in m.records.active_allocations()}  # what reconcile checks servers against
    assert problems(caplog, logging.ERROR) == []
    warnings = problems(caplog)
    assert len(warnings) == 1, warnings
    assert alloc.id in warnings[0] and "alice/train" in warnings[0]
    assert "'rtx3090'" in warnings[0] and "c.GPUPool.slurm_gpu_models" in warnings[0]
    # nobody else is given her GPU meanwhile: the pool has no such GPU
    assert all(g["index"] != gpu["index"] for n in pool_map(m) if n["node"] == alloc.node for g in n["gpus"]
               if g["model"] == R3090)

    # the inventory refresh (every 30 s) says nothing more while nothing changes
    caplog.clear()
    for _ in range(5):
        clock.advance(30)
        m.inventory.apply_node_status(source.node_status())
    assert problems(caplog) == []
    m.close()

    # the admin fixes the map and restarts the hub: her GPU is hers again, not held outside the hub
    caplog.clear()
    clock.advance(60)
    m, source = start(db, FULL_MAP, scontrol, clock)
    nodes = pool_map(m)
    shown = gpu_of(nodes, alloc.node, gpu["index"])
    assert [(h["user"], h["server"], h.get("held_outside")) for h in shown["holders"]] == [("alice", "train", None)]
    assert next(n for n in nodes if n["node"] == alloc.node)["held_outside"] == []
    assert m.ledger.allocations.get(alloc.id).released_at is None
    m.inventory.apply_node_status(source.node_status())
    assert problems(caplog) == []
    m.close()


def test_a_server_released_while_outside_the_pool_is_not_taken_back(tmp_path, caplog):
    """Her server stops while the map is broken: after the fix her GPU is free for others."""
    caplog.set_level(logging.INFO)
    db, clock, scontrol = f"sqlite:///{tmp_path / 'ledger.sqlite'}", Clock(), Scontrol()
    m, _ = start(db, FULL_MAP, scontrol, clock)
    alloc = m.admission.admit("alice", [], "train", Request(gpus=1), ["RTX 3090"])
    m.close()
    m, source = start(db, BROKEN_MAP, scontrol, clock)
    m.admission.release(alloc.id, "server stopped")
    caplog.clear()
    m.inventory.apply_node_status(source.node_status())  # nothing left to warn about
    assert problems(caplog) == []
    m.close()
    m, _ = start(db, FULL_MAP, scontrol, clock)
    shown = gpu_of(pool_map(m), alloc.node, alloc.gpus[0]["index"])
    assert shown["holders"] == [] and shown["allocated_fraction"] == "0.000"
    m.close()


def test_a_node_left_out_of_the_configuration_keeps_its_servers_allocations(tmp_path, caplog):
    """The same with ``c.GPUPool.nodes``: a node edited out by mistake, then put back."""
    caplog.set_level(logging.INFO)
    db, clock = f"sqlite:///{tmp_path / 'ledger.sqlite'}", Clock()
    nodes = [{"name": f"node-{x}", "cpu_milli": 8000, "memory_mib": 16384,
              "gpus": [{"index": 0, "uuid": f"GPU-{x}", "model": R3090}]} for x in "ab"]

    def restart(conf: list[dict]) -> PoolManager:
        m = make_manager(conf, PRICES, db, clock=clock, source=ConfigInventory(conf))
        m.restore()
        return m

    m = restart(nodes)
    alloc = m.admission.admit("alice", [], "", Request(gpus=1))
    m.close()
    caplog.clear()
    m = restart([n for n in nodes if n["name"] != alloc.node])
    assert m.ledger.allocations.get(alloc.id).released_at is None
    assert problems(caplog, logging.ERROR) == []
    [warning] = problems(caplog)
    assert re.search(rf"{alloc.id} of alice/-: node {alloc.node} is not in the pool; check the node in "
                     r"c\.GPUPool\.nodes", warning), warning
    m.close()
    m = restart(nodes)
    shown = gpu_of(pool_map(m), alloc.node, 0)
    assert [h["user"] for h in shown["holders"]] == ["alice"]
    m.close()


def test_a_gpu_its_agent_stops_reporting_stays_its_servers_and_is_taken_back_when_reported(tmp_path, caplog):
    """Inventory "agents": a GPU falls off the bus (NVML no longer lists it) under a server,
    then comes back after a reset. Each report rebuilds the pool: one WARNING while it is
    missing, and the GPU is its server's again as soon as a report brings it; a GPU whose
    server stopped meanwhile comes back free."""
    caplog.set_level(logging.INFO)
    db, clock = f"sqlite:///{tmp_path / 'ledger.sqlite'}", Clock()
    m = make_manager([], PRICES, db, clock=clock, inventory="agents", source=AgentInventory(90, clock=clock))
    m.restore()

    def report(indices: Sequence[int]) -> None:
        body = {"name": "n1", "cpu_milli": 8000, "memory_mib": 16384,
                "gpus": [{"index": i, "uuid": f"GPU-n1-{i}", "model": R3090} for i in indices]}
        m.inventory.accept_report("n1", body, load_node(body), m.ledger)

    report([0, 1, 2])
    alice = m.admission.admit("alice", [], "", Request(gpus=1))
    bob = m.admission.admit("bob", [], "", Request(gpus=1))
    caplog.clear()
    report([g for g in (0, 1, 2) if g not in (alice.gpus[0]["index"], bob.gpus[0]["index"])])  # both fell off
    report([g for g in (0, 1, 2) if g not in (alice.gpus[0]["index"], bob.gpus[0]["index"])])  # and the next tick
    assert problems(caplog, logging.ERROR) == []
    [warning] = problems(caplog)
    assert "alice/-" in warning and "bob/-" in warning and "its node agent reports other GPUs" in warning
    assert {r.user for r in m.ledger.allocations.active()} == {"alice", "bob"}

    m.admission.release(bob.id, "server stopped")  # bob's server ends while his GPU is missing
    caplog.clear()
    report([0, 1, 2])  # the GPUs are back
    nodes = pool_map(m)
    assert [h["user"] for h in gpu_of(nodes, "n1", alice.gpus[0]["index"])["holders"]] == ["alice"]
    assert gpu_of(nodes, "n1", bob.gpus[0]["index"])["holders"] == []
    assert problems(caplog) == []
    m.close()


def test_a_drained_node_is_logged_once_not_at_every_refresh(tmp_path, caplog):
    """Issue 48.9: an INFO line repeated every 5 s while a node stayed drained. Now once per change."""
    scontrol = Scontrol()
    scontrol.text = (DATA / "nodes_drain_resv.txt").read_text()
    with caplog.at_level(logging.INFO, "gpupool"):
        m, source = start(f"sqlite:///{tmp_path / 'l.sqlite'}", FULL_MAP, scontrol, Clock())
        for _ in range(3):  # three refreshes, nothing changed
            m.inventory.apply_node_status(source.node_status())
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Held outside the hub")]
    assert len(said) == 1, said
    assert "gpu-a': 'drained: fan broken x=1 (ticket 42)'" in said[0] and "[root@" not in said[0], said[0]
    scontrol.text = (DATA / "nodes_idle.txt").read_text()  # resumed: said once more
    with caplog.at_level(logging.INFO, "gpupool"):
        m.inventory.apply_node_status(source.node_status())
    assert len([r for r in caplog.records if r.getMessage().startswith("Held outside the hub")]) == 2
