"""The options form in a real hub whose configuration has no pool: prices come from the service.

The hub's ``jupyterhub_config.py`` sets ``c.GPUPool.nodes = []`` and no prices;
the gpupool service reads its own file (``GPUPOOL_CONFIG_FILE``), which loads
the hub's and adds the pool, other prices and ``min_start_hours = 2``. Every
figure the form shows must therefore have come from ``GET /models``.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from tests.spawner.conftest import POOL, set_balance, spawner_hub, start_ok

pytestmark = pytest.mark.integration

SERVICE_PRICES = {"RTX 3090": 1.5, "RTX A6000": 3}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    service_dir = tmp_path_factory.mktemp("service-config")
    service_config = service_dir / "gpupool_config.py"
    service_config.write_text(
        "import os\n"
        "c = get_config()  # noqa\n"
        "load_subconfig(os.environ['GPUPOOL_TEST_HUB_CONFIG'])  # database, jobs, profiles: as the hub says\n"
        f"c.GPUPool.nodes = {json.dumps(POOL)}\n"
        f"c.GPUPool.prices = {SERVICE_PRICES!r}\n"
        "c.GPUPool.min_start_hours = 2\n"
    )
    extra = f"""
c.GPUPool.nodes = []  # the hub knows no pool and no prices: only the service does
c.GPUPool.prices = {{}}
c.JupyterHub.services[0]["environment"] = {{
    "GPUPOOL_CONFIG_FILE": {str(service_config)!r},
    "GPUPOOL_TEST_HUB_CONFIG": __file__,
}}
"""
    yield from spawner_hub(tmp_path_factory, "formhub", extra)


def _form(hub, user: str) -> tuple[str, str]:
    page = hub.login(user).get(f"{hub.url}/hub/spawn", timeout=30)
    assert page.status_code == 200, page.text[:300]
    raw = page.content.decode()
    return raw, html.unescape(re.sub(r"<[^>]+>", "", raw))


def _block(raw: str, slug: str) -> str:
    """The text of one profile's part of the form."""
    m = re.search(rf'<div class="[^"]*" data-profile="{re.escape(slug)}".*?(?=<div class="gpupool-profile|</fieldset>)', raw, re.S)
    assert m, f"no profile {slug!r} in the form"
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(0)))


def test_form_shows_the_services_prices_when_the_hub_config_has_no_pool(hub):
    assert "c.GPUPool.nodes = []" in hub.config_path.read_text()
    set_balance(hub, "petra", "-5")
    raw, text = _form(hub, "petra")
    assert "Your balance: \u22125.0 tokens (GPU servers stop at \u221210)" in text
    assert "3 tokens/h" in _block(raw, "2x3090") and "2 × NVIDIA GeForce RTX 3090" in _block(raw, "2x3090")
    assert "1.5–3 tokens/h" in _block(raw, "1gpu")
    assert "NVIDIA GeForce RTX 3090: 1.5, NVIDIA RTX A6000: 3" in _block(raw, "1gpu")
    assert "Your balance buys 3.3 h above the floor" in _block(raw, "1gpu")  # (-5 - -10) / 1.5
    assert "3 tokens/h per GPU" in _block(raw, "a6000") and "1 × NVIDIA RTX A6000" in _block(raw, "a6000")
    assert "0.375 tokens/h" in _block(raw, "quarter") and "¼ of one NVIDIA GeForce RTX 3090" in _block(raw, "quarter")
    assert "no such GPU in this pool" in _block(raw, "h100")
    # min_start_hours is the service's (2): 2 x 3 tokens/h would take -5 below -10
    assert 'data-profile="2x3090" data-affordable="false"' in raw
    assert 'data-profile="1gpu" data-affordable="true"' in raw  # 2 x 1.5 = 3: -8 stays above the floor
    assert "it needs 6 tokens above your floor for its first 2 h" in _block(raw, "2x3090")
    # and what is free, also from the service
    assert "8 of 8 GPUs free" in _block(raw, "1gpu") and "4 of 4 GPUs free" in _block(raw, "2x3090")
    # and a link to the service's own page (issue 15)
    assert 'class="gpupool-usage-link" href="/services/gpupool/"' in raw


def test_form_shows_gpus_taken_by_a_running_server(hub):
    start_ok(hub, "quentin", {"profile": "2x3090"})
    raw, _ = _form(hub, "rhea")  # another user: quentin's own spawn page redirects to his server
    assert "2 of 4 GPUs free" in _block(raw, "2x3090") and "6 of 8 GPUs free" in _block(raw, "1gpu")
    assert "4 of 4 GPUs free" in _block(raw, "a6000")
