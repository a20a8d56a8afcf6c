"""Every request body is checked against openapi.json, by one function, before anything is written.

To each endpoint that takes a body, three bad bodies: a field of the wrong type, a
required field left out, and a field the endpoint does not know. Each gets a 400
whose message names the field by its JSON pointer, and the service keeps nothing
of it: no ledger entry, audit event, allocation change, inventory report, memory
warning or utilization reading. The good body then goes through, so the refusals
are the bodies' fault and nothing else's.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpupool_hub.timefmt import iso
from gpupool_hub.usage.utilization import ReportedUtilization
from tests.agent.test_service import TOKENS, Service

SPAWNER = "spawner-secret"
GPU = "GPU-0000-fake"

MEMORY_WARNING = {"user": "alice", "server": "", "gpu_uuid": GPU, "gpu_index": 0, "fraction_milli": 500,
                  "limit_bytes": 1 << 30, "used_bytes": 2 << 30, "since": "2026-11-24T10:00:00Z",
                  "deadline": "2026-11-24T10:01:00Z", "pids": [42]}
#: a new boundary warning's deadline is the agent's now plus its grace (a day: the suite may run long)
BOUNDARY_WARNING = {"user": "bob", "gpu_uuid": GPU, "gpu_index": 0,
                    "deadline": iso(datetime.now(timezone.utc) + timedelta(days=1)), "pids": [42]}


def _set(body: dict[str, Any], pointer: str, value: Any) -> dict[str, Any]:
    """``body`` with the field at ``pointer`` set to ``value`` (or removed, for ``...``)."""
    out = copy.deepcopy(body)
    *parents, last = pointer.strip("/").split("/")
    node: Any = out
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return out


#: endpoint, who calls, the good body, then (what is wrong, the field's pointer, its bad value; ... = left out)
CASES = [
    ("POST", "users/alice/grant", "admin-token", {"amount": "5", "reason": "a course"}, [
        ("wrong type", "/amount", True), ("missing", "/reason", ...), ("extra", "/colour", "blue")]),
    ("POST", "allocations", SPAWNER, {"user": "alice", "server": "s", "request": {"gpus": 1}}, [
        ("wrong type", "/request/gpus", "one"), ("missing", "/user", ...), ("extra", "/request/colour", "blue")]),
    ("PATCH", "allocations/{id}", SPAWNER, {"gpu_indices": [0]}, [
        # nothing is required there (indices, a start, a stop: issue 48.2/48.3): a second wrong type instead
        ("wrong type", "/gpu_indices/0", "0"), ("wrong type", "/started_at", 5), ("extra", "/node", "n1")]),
    ("PUT", "nodes/n1/inventory", TOKENS["n1"],
     {"cpu_milli": 8000, "memory_mib": 32768, "gpus": [{"index": 0, "uuid": GPU, "model": "NVIDIA A100-SXM4-80GB"}]}, [
        ("wrong type", "/cpu_milli", "8000"), ("missing", "/memory_mib", ...), ("extra", "/colour", "blue")]),
    ("PUT", "nodes/n1/utilization", TOKENS["n1"], {"gpus": {GPU: 0.5}, "memory": {GPU: [1, 2]}}, [
        ("wrong type", f"/gpus/{GPU}", "high"), ("missing", "/gpus", ...), ("extra", "/temperature", 60)]),
    ("PUT", "nodes/n1/memory", TOKENS["n1"], {"warnings": [MEMORY_WARNING], "actions": [], "dry_run": False}, [
        ("wrong type", "/warnings/0/pids", "42"), ("missing", "/warnings/0/gpu_index", ...),
        ("extra", "/warnings/0/colour", "blue")]),
    ("PUT", "nodes/n1/boundary", TOKENS["n1"], {"warnings": [BOUNDARY_WARNING], "actions": [], "dry_run": False}, [
        ("wrong type", "/dry_run", "no"), ("missing", "/warnings/0/user", ...), ("extra", "/warnings/0/colour", 1)]),
]


def written(service: Service, utilization: ReportedUtilization) -> Any:
    """Everything a request could have changed, as plain values."""
    m = service.manager
    return (m.ledger.verify().entries, [e.id for e in m.ledger.audit.page(limit=500)],
            [(r.id, r.node, r.gpus, r.released_at) for r in m.ledger.allocations.active()],
            {n: (m.inventory.reports[n].inventory, m.inventory.reports[n].last_seen) for n in m.inventory.reports},
            {n: (w, dry) for n, (_at, w, dry) in m.memory.reports.items()},
            dict(utilization._gpus), dict(utilization._memory))


@pytest.fixture
async def service(tmp_path):
    utilization = ReportedUtilization(0.05)
    s = Service(tmp_path, utilization=utilization, spawner_token=SPAWNER)
    s.utilization = utilization
    s.manager.accounts.ensure("alice", [])
    yield s
    s.stop()


@pytest.mark.parametrize("method, path, token, good, bad", CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
async def test_a_bad_body_is_400_naming_the_field_and_nothing_is_written(service, method, path, token, good, bad):
    if "{id}" in path:
        code, placed = await service.call("POST", "allocations", SPAWNER,
                                          {"user": "alice", "server": "patch", "request": {"gpus": 1}})
        assert code == 201, placed
        path = path.replace("{id}", placed["allocation"]["id"])
        good = {"gpu_indices": [g["index"] for g in placed["allocation"]["gpus"]]}
    if path.endswith("/memory"):  # a memory warning is about a user holding a share of that GPU
        code, placed = await service.call("POST", "allocations", SPAWNER,
                                          {"user": "alice", "server": "", "request": {"gpu_fraction": 0.5}})
        assert code == 201, placed
        held = placed["allocation"]["gpus"][0]
        good = _set(_set(good, "/warnings/0/gpu_uuid", held["uuid"]), "/warnings/0/gpu_index", held["index"])
    for what, pointer, value in bad:
        before = written(service, service.utilization)
        code, answer = await service.call(method, path, token, _set(good, pointer, value))
        assert code == 400, (what, answer)
        assert pointer in answer["message"], (what, answer["message"])
        assert written(service, service.utilization) == before, f"{what}: something was written"
    code, answer = await service.call(method, path, token, good)
    assert code in (200, 201), answer
