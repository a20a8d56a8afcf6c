"""The admin pool map of a large pool is computed once per change (issue 48.10), and every
change shows on the next render: a new waiter, a start, a release.

The summary of a pool past ``FULL_MAP_NODES`` nodes (held and free per model, the largest
holders) is kept until the pool allocates or releases; the waiting table builds only the
rows it shows. Neither may show an old state: each step below changes the pool or the
queue and reads the page once.
"""

from __future__ import annotations

import re

import pytest

from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.pages import poolmap
from tests.fixtures.manager import Clock, make_manager

from .inprocess import PagesService, attrs, user_model

MODEL = "NVIDIA GeForce RTX 3090"
#: one node past the size the map draws cell by cell: the page is the per-model summary
NODE_COUNT = poolmap.FULL_MAP_NODES + 1


@pytest.fixture
async def service(tmp_path):
    nodes = [{"name": f"gpu{i:02d}", "cpu_milli": 16_000, "memory_mib": 65_536, "gpus": {"count": 1, "model": MODEL}}
             for i in range(NODE_COUNT)]
    manager = make_manager(nodes, {"RTX 3090": 1}, f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=Clock(),
                           queue_enabled=True, queue_poll_timeout=7200)
    s = PagesService(manager, {"admin-token": user_model("admin", admin=True)})
    yield s
    s.stop()


def admit(m, user):
    return m.admission.admit(user, [], "", parse_request({"gpus": 1}), None)


def wait(m, user):
    with pytest.raises(Refused):
        admit(m, user)


async def render(service, query=""):
    """The page as the admin reads it: the model's row (held, whole free, free), the holders
    in the legend, the waiting servers in order, the allocations listed."""
    r = await service.client("admin-token").get("admin/pool" + query)
    assert r.code == 200, r.body[:500]
    body = r.body.decode()
    row = body[body.index(f'<tr data-model="{MODEL}">'):] if not query else ""
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)[:6]
    free = body[body.index('data-gpupool="free"'):] if query else ""
    return {"held": cells[2] if cells else None, "whole_free": cells[3] if cells else None,
            "drill_whole_free": re.findall(r'<td class="num">([^<]*)</td>', free)[:1],
            "holders": set(re.findall(r'<li data-user="([^"]*)"', body)),
            "waiting": [w["data-user"] for w in attrs(body, "data-since=")],
            "allocations": len(attrs(body, "data-allocation=")), "body": body}


async def test_every_change_shows_on_the_next_render(service):
    m = service.manager
    held = {f"u{i:02d}": admit(m, f"u{i:02d}") for i in range(NODE_COUNT)}  # every GPU held
    page = await render(service)
    assert 'data-gpupool="pool-summary"' in page["body"]  # the summary, not cells
    assert (page["held"], page["whole_free"], page["waiting"]) == (str(NODE_COUNT), "0", [])
    assert "Nobody is waiting." in page["body"]

    # a new waiter
    wait(m, "ann")
    page = await render(service)
    assert page["waiting"] == ["ann"]

    # a release: its GPU is reserved for ann, the holder is gone from the legend
    m.admission.release(held.pop("u00").id, "server stopped")
    page = await render(service)
    assert "u00" not in page["holders"] and "u01" in page["holders"]
    assert "GPUs reserved on gpu" in page["body"]

    # a start: ann claims it, and holds it
    admit(m, "ann")
    page = await render(service)
    assert page["waiting"] == [] and "ann" in page["holders"]
    assert page["held"] == str(NODE_COUNT) and page["allocations"] == NODE_COUNT

    # a release with nobody waiting: a whole GPU is free, in the summary and in the model's drill-down
    m.admission.release(held.pop("u01").id, "server stopped")
    page = await render(service)
    assert (page["held"], page["whole_free"]) == (str(NODE_COUNT - 1), "1") and "u01" not in page["holders"]
    drill = await render(service, f"?model={MODEL.replace(' ', '%20')}")
    assert drill["drill_whole_free"] == ["1"]

    # a start on it: held again, the newcomer among the holders
    admit(m, "abe")
    page = await render(service)
    assert (page["held"], page["whole_free"]) == (str(NODE_COUNT), "0") and "abe" in page["holders"]
    drill = await render(service, f"?model={MODEL.replace(' ', '%20')}")
    assert drill["drill_whole_free"] == ["0"]


async def test_a_long_queue_shows_its_head_in_order(service, monkeypatch):
    # two rows shown instead of 100, so that three waiters make a queue longer than the table
    monkeypatch.setattr(poolmap, "WAITING_SHOWN", 2)
    m = service.manager
    for i in range(NODE_COUNT):
        admit(m, f"u{i:02d}")
    for name in ("cat", "bob", "amy"):  # joined in this order: the queue's order, not the names'
        wait(m, name)
        m.clock.advance(60)
    page = await render(service)
    assert page["waiting"] == ["cat", "bob"]
    assert "The next 2 of 3." in page["body"]
    # the first leaves: the next render shows the two behind it
    m.queue.leave("cat", "")
    page = await render(service)
    assert page["waiting"] == ["bob", "amy"] and "The next" not in page["body"]
