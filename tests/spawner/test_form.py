"""The options form without a hub: escaping, an unreachable service, what is free, admin templates."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone
from decimal import Decimal

from gpupool_hub.spawner import render_form
from gpupool_hub.spawner.form import form_context
from tests.spawner.test_units import dead_url, make

PROFILES = [
    {"slug": "cpu", "display_name": "CPU <b>only</b>", "default": True},
    {"slug": "a6000", "display_name": "A6000", "gpus": 1, "max_gpus": 3, "models": ["RTX A6000"],
     "description": 'Big "models" & <script>alert(1)</script>'},
    {"slug": "quarter", "display_name": "1/4", "gpu_fraction": 0.25},
    {"slug": "h100", "display_name": "H100", "gpus": 1, "models": ["H100"]},
]
CATALOG = {
    "models": [
        {"model": "NVIDIA GeForce RTX 3090", "price_per_gpu_hour": "1.000", "gpus": 4, "whole_free": 4,
         "largest_whole_block": 2},
        {"model": "NVIDIA RTX A6000", "price_per_gpu_hour": "4.000", "gpus": 4, "whole_free": 1,
         "largest_whole_block": 1},
        {"model": "Unpriced <GPU>", "price_per_gpu_hour": None, "gpus": 2, "whole_free": 2,
         "largest_whole_block": 2},
    ],
    "min_start_hours": "1.000",
}
ACCOUNT = {"balance": "-8.500", "floor": "-10.000", "credits": {"daily": "5.000"}}


def test_values_are_escaped():
    page = render_form(make(profiles=PROFILES), ACCOUNT, CATALOG)
    assert "<b>only</b>" not in page and "CPU &lt;b&gt;only&lt;/b&gt;" in page
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Big &#34;models&#34; &amp;" in page
    assert "Unpriced" not in page  # a model without a price is not offered


def test_prices_free_gpus_and_affordability_come_from_the_catalog():
    ctx = form_context(make(profiles=PROFILES).gpupool_profiles, None, ACCOUNT, CATALOG)
    assert {k: ctx["balance"][k] for k in ("value", "text", "floor", "daily")} == {
        "value": "-8.500", "text": "\u22128.5", "floor": "\u221210", "daily": "5"}
    cpu, a6000, quarter, h100 = ctx["profiles"]
    assert (cpu.price, cpu.gpu, cpu.affordable, cpu.free) == ("free", "none", True, "")
    assert (a6000.price, a6000.gpu) == ("4 tokens/h per GPU", "1 × NVIDIA RTX A6000")
    assert a6000.hours == "Your balance buys 0.4 h above the floor"
    assert (a6000.affordable, a6000.free, a6000.gpu_counts) == (False, "1 of 4 GPUs free", (1, 2, 3))
    assert a6000.needs == "needs 4 tokens above your floor for its first 1 h; you have 1.5"
    assert quarter.price == "0.25–1 tokens/h"
    assert quarter.price_models == "NVIDIA GeForce RTX 3090: 0.25, NVIDIA RTX A6000: 1"
    assert quarter.affordable and quarter.free == "5 of 8 GPUs free" and not quarter.full
    assert (h100.price, h100.affordable, h100.needs) == ("no such GPU in this pool", False, None)
    stricter = form_context(make(profiles=PROFILES).gpupool_profiles, None, ACCOUNT,
                            dict(CATALOG, min_start_hours="8"))
    assert not stricter["profiles"][2].affordable
    assert stricter["profiles"][2].needs.startswith("needs 2 tokens above your floor for its first 8 h")


def test_a_share_is_full_only_when_no_gpu_has_room_for_it():
    quarter = make(profiles=PROFILES).gpupool_profiles[2]
    taken = {"models": [dict(m, whole_free=0, largest_whole_block=0) for m in CATALOG["models"]],
             "min_start_hours": "1"}
    room = dict(taken, models=[dict(m, largest_share_milli=500) for m in taken["models"]])
    assert form_context([quarter], None, ACCOUNT, room)["profiles"][0].free == "room on a GPU already shared"
    crowded = dict(taken, models=[dict(m, largest_share_milli=200, waiting=1) for m in taken["models"]])
    choice = form_context([quarter], None, ACCOUNT, crowded)["profiles"][0]
    assert choice.full and choice.free.startswith("full — 1 waiting")


def test_the_form_renders_when_the_service_is_unreachable():
    s = make(profiles=PROFILES, gpupool_api_url=dead_url(), request_timeout=2)
    page = asyncio.run(s._render_gpupool_form(s))
    assert "Your balance is unavailable right now" in page
    assert page.count("price unavailable right now") == 6 and 'value="cpu"' in page  # the card's price and its words
    assert 'data-affordable="false"' not in page  # unknown is not unaffordable: the start decides


def test_balance_and_prices_are_asked_for_at_the_same_time():
    s = make(profiles=PROFILES)
    catalog_asked = asyncio.Event()

    async def account():
        # if the form asked one after the other, the catalog would never be asked: timeout
        await asyncio.wait_for(catalog_asked.wait(), 5)
        return ACCOUNT

    async def catalog():
        catalog_asked.set()
        return CATALOG

    s.gpupool_account, s.gpupool_catalog = account, catalog
    page = asyncio.run(s._render_gpupool_form(s))
    assert "Your balance: <strong>\u22128.5 tokens</strong>" in page and "1 of 4 GPUs free" in page


def checked(page: str) -> list[str]:
    """The profiles whose radio input is checked, as the browser reads the page."""
    return re.findall(r'<input type="radio" name="profile" value="([^"]*)" checked', page)


def test_previous_choice_is_preselected():
    s = make(profiles=PROFILES)
    assert checked(render_form(s, None, None)) == ["cpu"]
    s.user_options = {"profile": "quarter"}
    assert checked(render_form(s, None, None)) == ["quarter"]


FLOOR_STOP = {"id": 7, "kind": "floor_stop", "at": "2026-11-28T01:00:00Z", "server": "", "title": "Your server was "
              "stopped: your balance reached the floor", "why": "balance at the floor", "kept": "Files are kept."}


def test_after_a_floor_stop_cpu_only_is_preselected_and_after_a_refusal_the_refused_profile():
    s = make(profiles=PROFILES)
    s.user_options = {"profile": "a6000"}  # the server that was stopped at the floor
    stopped = dict(ACCOUNT, notices=[FLOOR_STOP])
    page = render_form(s, stopped, CATALOG)
    assert checked(page) == ["cpu"] and "so <strong>CPU &lt;b&gt;only&lt;/b&gt;</strong> is chosen below" in page
    # the user picks the A6000 again and the pool refuses it: the refused profile stays selected
    s.gpupool_refused_at = datetime(2026, 11, 28, 1, 5, tzinfo=timezone.utc)
    assert checked(render_form(s, stopped, CATALOG)) == ["a6000"]
    # a floor stop of another server, or one dismissed (no notice), keeps the last choice
    other = dict(ACCOUNT, notices=[dict(FLOOR_STOP, server="big")])
    s.gpupool_refused_at = None
    assert checked(render_form(s, other, CATALOG)) == ["a6000"]
    assert checked(render_form(s, ACCOUNT, CATALOG)) == ["a6000"]


def test_every_card_is_a_labelled_radio_input_described_by_its_facts():
    page = render_form(make(profiles=PROFILES), ACCOUNT, CATALOG)
    for slug in ("cpu", "a6000", "quarter", "h100"):
        assert re.search(f'<input type="radio" name="profile" value="{slug}"( checked)? id="gpupool-profile-{slug}" '
                         f'aria-describedby="gpupool-about-{slug}">', page)
        assert f'<label class="gpupool-title" for="gpupool-profile-{slug}">' in page
        assert f'<div class="gpupool-card-body" id="gpupool-about-{slug}">' in page


def test_the_card_needs_what_the_service_refuses_by_with_the_servers_already_running():
    """Issue 39.5: the banner said "needs 6.5 tokens" while the card said 4. Both come from
    credits.start_need: a 4 tokens/h A6000 beside a running 2.5 tokens/h server needs 6.5."""
    from gpupool_hub.money.credits import CreditRules, start_need
    from gpupool_hub.money.shortfall import shortfall_message

    running = dict(ACCOUNT, balance="-4", burn_rate_per_hour="2.500")
    a6000 = form_context(make(profiles=PROFILES).gpupool_profiles, None, running, CATALOG)["profiles"][1]
    assert a6000.needs == ("needs 6.5 tokens above your floor for its first 1 h together with your running "
                           "GPU servers; you have 6")
    need = start_need(Decimal(4), Decimal("2.5"), Decimal(1))
    assert need == Decimal("6.5") and not a6000.affordable
    assert CreditRules(floor=Decimal(-10)).floor + need > Decimal(-4)  # what the card refuses, admission refuses
    details = {"balance": "-4.000", "price_per_hour": "4.000", "floor": "-10.000", "held_price_per_hour": "2.500",
               "held": [{"server": "", "price_per_hour": "2.500"}], "needs": str(need), "min_start_hours": "1.000",
               "credit": None}
    banner = shortfall_message(details, None, str)
    assert "you already run 1 GPU server costing 2.5 tokens/h" in banner
    assert "needs 6.5 tokens above the floor of \u221210" in banner and "(s)" not in banner


def test_admins_template_is_used_first_and_may_extend_the_packaged_one(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "form.html").write_text(
        '{% extends "gpupool/form.html" %}\n'
        "{% block balance %}<p class=\"site-note\">Ask {{ 'R&D' }} for tokens.</p>{{ super() }}{% endblock %}\n"
    )
    (second / "form.html").write_text("never used")
    s = make(profiles=PROFILES, form_template_paths=[str(first), str(second)])
    page = render_form(s, ACCOUNT, CATALOG)
    assert '<p class="site-note">Ask R&amp;D for tokens.</p>' in page
    assert "Your balance: <strong>\u22128.5 tokens</strong>" in page and 'data-profile="a6000"' in page
    s = make(profiles=PROFILES, form_template_paths=[str(second)])
    assert render_form(s, ACCOUNT, CATALOG) == "never used"


def test_each_share_shows_its_class_in_words_next_to_its_price():
    profiles = PROFILES + [{"slug": "capped", "display_name": "Capped 3/4", "gpu_fraction": 0.75, "share": "mps"},
                           {"slug": "slice", "display_name": "MIG slice", "mig": "1g.10gb"}]
    page = render_form(make(profiles=profiles), ACCOUNT, CATALOG)
    assert '<span class="gpupool-class" data-class="timeslice">time-sliced: shared, best effort</span>' in page
    assert '<span class="gpupool-class" data-class="mps">MPS: memory capped</span>' in page
    assert '<span class="gpupool-class" data-class="mig">MIG: isolated</span>' in page
    assert page.count('class="gpupool-class"') == 3  # whole GPUs and CPU-only profiles share nothing


def test_get_models_lists_each_profiles_class_and_price(tmp_path):
    from gpupool_hub.profiles import parse_profiles
    from gpupool_hub.service.core.catalog import catalog
    from tests.fixtures.manager import make_manager
    from tests.service.openapi import check

    nodes = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768,
              "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "A100", "memory_mib": 81920} for i in range(2)]}]
    m = make_manager(nodes, {"A100": 2}, f"sqlite:///{tmp_path / 'l.sqlite'}")
    try:
        m.inventory.expect_profiles(parse_profiles([
            {"slug": "w", "gpus": 1}, {"slug": "capped", "gpu_fraction": 0.75, "share": "mps"},
            {"slug": "t", "gpu_fraction": 0.25}, {"slug": "h", "gpu_fraction": 0.25, "models": ["H100"]}]))
        body = catalog(m.inventory, m.settings.min_start_hours)
        check("Models", body)
        assert [(p["slug"], p["class"], p["class_words"], p["prices"]) for p in body["profiles"]] == [
            ("w", "", "", {"A100": "2.000"}), ("capped", "mps", "memory capped", {"A100": "1.500"}),
            ("t", "timeslice", "shared, best effort", {"A100": "0.500"}), ("h", "timeslice", "shared, best effort", {})]
    finally:
        m.close()


def test_gpus_kept_whole_for_bigger_profiles_are_not_free_on_the_card():
    """The service keeps the last whole nodes for a configured 8-GPU profile (issue 50): a
    one-GPU card must not say those GPUs are free, since its spawn would queue; it says why."""
    profiles = [{"slug": "one", "display_name": "One", "gpus": 1},
                {"slug": "node", "display_name": "Node", "gpus": 8}]
    model = "NVIDIA A100-SXM4-80GB"
    catalog = {"models": [{"model": model, "price_per_gpu_hour": "2.000", "gpus": 128, "whole_free": 40,
                           "largest_whole_block": 8, "waiting": 3}],
               "min_start_hours": "1.000",
               "profiles": [{"slug": "one", "kept_whole": {model: 32}}, {"slug": "node", "kept_whole": {}}]}
    ctx = form_context(make(profiles=profiles).gpupool_profiles, None, {"balance": "100.000"}, catalog)
    one, node = ctx["profiles"]
    assert one.free == "8 of 128 GPUs free (32 free GPUs kept whole for servers of more GPUs)"
    assert not one.full and node.free == "40 of 128 GPUs free"
    catalog["profiles"][0]["kept_whole"] = {model: 40}  # every free GPU is on a kept node
    one = form_context(make(profiles=profiles).gpupool_profiles, None, {"balance": "100.000"}, catalog)["profiles"][0]
    assert one.full and one.free == "full — 3 waiting (40 free GPUs kept whole for servers of more GPUs)"


def test_a_profile_of_several_gpus_is_full_when_no_node_has_that_many_free():
    """Several GPUs of a server are on one node: 40 free GPUs, at most 3 on any node, leave no
    room for a 4-GPU profile (its spawn would queue), while a 2-GPU profile still starts."""
    profiles = [{"slug": "two", "display_name": "Two", "gpus": 2},
                {"slug": "four", "display_name": "Four", "gpus": 4}]
    catalog = {"models": [{"model": "NVIDIA A100-SXM4-80GB", "price_per_gpu_hour": "2.000", "gpus": 128,
                           "whole_free": 40, "largest_whole_block": 3}],
               "min_start_hours": "1.000"}
    two, four = form_context(make(profiles=profiles).gpupool_profiles, None, {"balance": "100.000"},
                             catalog)["profiles"]
    assert (two.full, two.free) == (False, "40 of 128 GPUs free")
    assert four.full and four.free == "full (40 free GPUs, at most 3 on one node)"
