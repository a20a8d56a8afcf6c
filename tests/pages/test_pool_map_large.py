"""The admin pool map of a national facility's pool (issue 26): 1,000 nodes, 10,000 GPUs.

Drawn cell by cell that is megabytes of SVG. The map instead sums the pool up per
GPU model and draws the cells of one model's nodes, or of the nodes found by
name, a page at a time, so each page stays small (≤ 500 kB) and still says
who holds what.
"""

from __future__ import annotations

import re

import pytest

from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.pages.poolmap import NODES_PER_PAGE
from tests.fixtures.manager import make_manager

from .inprocess import PREFIX, PagesService, attrs, chromium_on, user_model

MODELS = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3090", "NVIDIA L40S"]
PRICES = {"A100": 4, "H100": 8, "RTX 3090": 1, "L40S": 3}
NODE_COUNT = 1000
PAGE_LIMIT = 500_000


def big_pool() -> list[dict]:
    """1,000 nodes of 10 GPUs, a quarter of them of each model."""
    return [{"name": f"gpu{i:04d}", "cpu_milli": 128_000, "memory_mib": 1_048_576,
             "gpus": {"count": 10, "model": MODELS[i % len(MODELS)]}} for i in range(NODE_COUNT)]


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bigpool")
    manager = make_manager(big_pool(), PRICES, f"sqlite:///{tmp / 'ledger.sqlite'}")
    for i in range(300):  # 300 users, one or two GPUs each, on the A100 and H100 nodes
        manager.admission.admit(f"user{i:03d}", [], "", parse_request(
            {"gpus": 1 + i % 2, "models": [MODELS[i % 2]]}), [MODELS[i % 2]])
    return manager


@pytest.fixture
async def service(manager):
    s = PagesService(manager, {"admin-token": user_model("admin", admin=True)})
    yield s
    s.stop()


async def get(service, path):
    r = await service.client("admin-token").get(path)
    assert r.code == 200, r.body[:500]
    body = r.body.decode()
    assert len(r.body) <= PAGE_LIMIT, f"{path}: {len(r.body):,} bytes"
    return body


async def test_a_large_pool_gets_one_row_per_model_not_ten_thousand_cells(service):
    body = await get(service, "admin/pool")
    [summary] = attrs(body, 'data-gpupool="pool-summary"')
    assert summary["data-nodes"] == str(NODE_COUNT)
    rows = {r["data-model"]: r for r in attrs(body, "data-model=")}
    assert sorted(rows) == sorted(MODELS)
    table = body[body.index('data-gpupool="models"'):]
    a100 = table[table.index(f'data-model="{MODELS[0]}"'):]
    cells = re.findall(r'<td class="num">([^<]*)</td>', a100)[:6]
    # 250 nodes, 2,500 GPUs, 150 users x 1 GPU held, 2,350 whole GPUs free, a whole free node (10), 2,350 GPU free
    assert cells == ["250", "2500", "150", "2350", "10", "2350"], cells
    assert 'data-gpupool="gpu"' not in body  # no cells drawn
    assert "The newest\n  100 of 300" in body  # the allocations table says it shows a part
    [holders] = attrs(body, 'data-gpupool="holders"')
    assert holders  # the top holders are listed
    assert len(re.findall(r"<li data-user=", body)) == 20


async def test_a_model_drills_down_a_page_of_nodes_with_their_cells(service):
    model = MODELS[1]
    body = await get(service, f"admin/pool?model={model.replace(' ', '%20')}")
    [drill] = attrs(body, 'data-gpupool="drill-down"')
    assert drill["data-matched"] == "250" and drill["data-page"] == "1" and drill["data-pages"] == "10"
    nodes = [n["data-node"] for n in attrs(body, 'data-gpupool="node"')]
    assert len(nodes) == NODES_PER_PAGE and nodes[0] == "gpu0001"
    cells = attrs(body, 'data-gpupool="gpu"')
    assert len(cells) == NODES_PER_PAGE * 10 and {c["data-model"] for c in cells} == {model}
    assert {c["data-state"] for c in cells} == {"held", "free"}
    assert 'rel="next"' in body and 'rel="prev"' not in body
    # the last page, and the allocations listed are those of the nodes shown
    last = await get(service, f"admin/pool?model={model.replace(' ', '%20')}&page=10")
    shown = {n["data-node"] for n in attrs(last, 'data-gpupool="node"')}
    assert len(shown) == NODES_PER_PAGE and 'rel="next"' not in last
    listed = re.findall(r'<tr data-allocation="[^"]+"><td>.*?</td>\s*<td>.*?</td><td>([^<]+)</td>', last, re.S)
    assert listed and set(listed) <= shown


async def test_a_node_is_found_by_name(service):
    body = await get(service, "admin/pool?node=GPU0999")
    assert [n["data-node"] for n in attrs(body, 'data-gpupool="node"')] == ["gpu0999"]
    nothing = await get(service, "admin/pool?node=no-such-node")
    [drill] = attrs(nothing, 'data-gpupool="drill-down"')
    assert drill["data-matched"] == "0" and 'data-gpupool="node"' not in nothing


@pytest.mark.parametrize("query, why", [("node=%ED%A0%80", "Invalid unicode"), ("page=0", "page must be"),
                                        ("model=" + "m" * 300, "at most 255")])
async def test_bad_filters_are_refused_saying_why(service, query, why):
    r = await service.client("admin-token").get(f"admin/pool?{query}")
    assert r.code == 400 and why in r.body.decode()



async def test_the_summary_and_a_drilled_down_model_in_chromium(service):
    """What an admin sees: the summary, then one model's first page of nodes (screenshots
    in build/screenshots/pages/: pool-map-1000-nodes.png and pool-map-1000-nodes-h100.png)."""
    from .conftest import SCREENSHOTS

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    async with chromium_on(service) as open_as:
        page = await open_as("admin-token")
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        await page.goto(f"{service.origin}{PREFIX}admin/pool", wait_until="load")
        assert await page.locator("[data-gpupool=models] tbody tr").count() == len(MODELS)
        assert await page.locator("[data-gpupool=gpu]").count() == 0
        await page.screenshot(path=str(SCREENSHOTS / "pool-map-1000-nodes.png"), full_page=False)
        await page.click(f"text={MODELS[1]}")
        await page.wait_for_selector("[data-gpupool=drill-down]")
        assert await page.locator("[data-gpupool=node]").count() == NODES_PER_PAGE
        assert await page.locator(f"[data-gpupool=gpu][data-model='{MODELS[1]}']").count() == NODES_PER_PAGE * 10
        await page.screenshot(path=str(SCREENSHOTS / "pool-map-1000-nodes-h100.png"), full_page=False)
        # the search finds one node among the thousand
        await page.fill("[data-gpupool=node-search] input[name=node]", "gpu0421")
        await page.click("[data-gpupool=node-search] button")
        await page.wait_for_selector("[data-gpupool=node][data-node=gpu0421]")
        found = [await n.get_attribute("data-node") for n in await page.locator("[data-gpupool=node]").all()]
        assert found == ["gpu0421"]
        assert errors == []
