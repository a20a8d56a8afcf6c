"""Issue 48.2 and 48.3 in the service: an allocation whose batch job is pending holds its GPUs and is
charged nothing until the job starts; one whose stop is not confirmed stays held and charged, and the
reconcile job, which releases allocations of servers the hub no longer runs, leaves it alone.

The real service app in process (tests/agent/test_service.py's ``Service``), its own records as the
usage source, a hub stand-in for reconcile's one question (which servers run).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from gpupool_hub.service.jobs.reconcile import ReconcileJob
from gpupool_hub.usage.own_records import AllocationRecordsSource
from tests.agent.test_service import Service
from tests.fixtures.manager import Clock
from tests.pages.inprocess import PagesService, attrs, user_model

SPAWNER = "spawner-token"


@pytest.fixture
async def service(tmp_path):
    s = Service(tmp_path, clock=Clock(), spawner_token=SPAWNER)  # a clock the test moves
    yield s
    s.stop()


def gpu_seconds(service: Service, start, end) -> Decimal:
    return sum((u.gpu_seconds for u in AllocationRecordsSource(service.manager.ledger).usage(start, end)),
               Decimal(0))


async def allocate(service: Service, user: str, **extra) -> dict:
    code, answer = await service.call("POST", "allocations", SPAWNER,
                                      {"user": user, "server": "", "request": {"gpus": 1}, **extra})
    assert code == 201, answer
    return answer["allocation"]


async def test_a_pending_job_holds_its_gpu_and_is_charged_from_its_start(service):
    alloc = await allocate(service, "alice", pending=True)
    assert alloc["charged_from"] is None
    created = service.manager.ledger.allocations.get(alloc["id"]).created_at
    later = created + timedelta(minutes=10)
    assert gpu_seconds(service, created, later) == 0  # held, nothing charged
    assert [r.id for r in service.manager.ledger.allocations.active()] == [alloc["id"]]  # but held
    service.manager.clock.advance(10 * 60)  # the job started 4 minutes in; Slurm says so 6 minutes later
    started = created + timedelta(minutes=4)
    code, answer = await service.call("PATCH", f"allocations/{alloc['id']}", SPAWNER,
                                      {"started_at": started.isoformat().replace("+00:00", "Z")})
    assert code == 200 and answer["allocation"]["charged_from"] is not None, answer
    assert gpu_seconds(service, created, later) == 6 * 60  # from its start, not its creation
    # a repeat does not move it
    await service.call("PATCH", f"allocations/{alloc['id']}", SPAWNER, {"started_at": later.isoformat()})
    assert gpu_seconds(service, created, later) == 6 * 60


async def test_an_ordinary_allocation_is_charged_from_its_creation(service):
    alloc = await allocate(service, "bob")
    created = service.manager.ledger.allocations.get(alloc["id"]).created_at
    assert alloc["charged_from"] == alloc["started_at"]
    assert gpu_seconds(service, created, created + timedelta(minutes=10)) == 600


class HubWithoutServers:
    """The hub as reconcile sees it after a stop: the server is not running, and was last seen long ago."""

    async def users(self, state=None):
        return
        yield

    async def request(self, method, path, params=None, allow_404=False):
        return {"name": "carol", "servers": {"": {"stopped": True, "last_activity": "2000-01-01T00:00:00Z"}}}


async def test_a_stop_not_confirmed_keeps_the_gpu_held_and_charged(service):
    m = service.manager
    alloc = await allocate(service, "carol")
    code, answer = await service.call("PATCH", f"allocations/{alloc['id']}", SPAWNER, {"stopping": True})
    assert code == 200 and answer["allocation"]["stopping_since"] is not None, answer
    await ReconcileJob(HubWithoutServers(), m.records, m.admission, grace=0)()
    [held] = m.ledger.allocations.active()  # the hub says stopped; the engine did not confirm: still held
    assert held.id == alloc["id"] and held.released_at is None
    # the admin's pool map says so
    pages = PagesService(m, {"admin-token": user_model("admin", admin=True)})
    try:
        r = await pages.client("admin-token").get("admin/pool")
        [row] = [a for a in attrs(r.body.decode(), 'data-state="') if "data-allocation" in a]
        assert row["data-allocation"] == alloc["id"] and row["data-state"] == "stopping"
    finally:
        pages.stop()
    # the spawner's release, once the engine confirms, ends it
    code, _ = await service.call("DELETE", f"allocations/{alloc['id']}", SPAWNER)
    assert code == 200 and m.ledger.allocations.active() == []


async def test_without_a_stop_mark_reconcile_releases_a_stopped_server(service):
    m = service.manager
    await allocate(service, "carol")
    await ReconcileJob(HubWithoutServers(), m.records, m.admission, grace=0)()
    assert m.ledger.allocations.active() == []
