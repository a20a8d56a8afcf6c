"""Issue 39.5, words that agree: what a start needs, which credit makes it fit and when, in one rule.

The service's admission refuses a start by ``credits.start_need`` (every server the
user holds plus this one, for ``min_start_hours``); the spawn form's card says the
same amount from the same rule and the same answers (``GET me``, ``GET models``);
the refusal names the credit that really gets there (the monthly one on the 1st,
not "the daily credits") with that credit's date, worded by ``timefmt.when_text``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest

from gpupool_hub.profiles import parse_profiles
from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.catalog import catalog
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.spawner.form import form_context
from tests.fixtures.manager import Clock, make_manager

NODES = [{"name": "n1", "cpu_milli": 64000, "memory_mib": 262144,
          "gpus": [{"index": 0, "uuid": "GPU-0", "model": "NVIDIA GeForce RTX 3090", "memory_mib": 24576},
                   {"index": 1, "uuid": "GPU-1", "model": "NVIDIA RTX A6000", "memory_mib": 49152}]}]
PRICES = {"RTX 3090": 2.5, "RTX A6000": 4}
PROFILES = parse_profiles([{"slug": "3090", "gpus": 1, "models": ["RTX 3090"]},
                           {"slug": "a6000", "gpus": 1, "models": ["RTX A6000"]}])
#: a Saturday; Tuesday 1 December brings the monthly credit
SATURDAY = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def refused_beside_a_running_server(tmp_path, daily: int) -> tuple[Refused, dict, dict]:
    """16 tokens above the floor, a 2.5 tokens/h server running; an A6000 (4/h) for 3 h needs 19.5."""
    m = make_manager(NODES, PRICES, f"sqlite:///{tmp_path / f'l{daily}.sqlite'}", clock=Clock(SATURDAY),
                     initial_grant=6, floor=-10, daily_credit=daily, monthly_credit=30, min_start_hours=3,
                     credit_timezone="Europe/Berlin")
    try:
        m.admission.admit("ana", [], "small", parse_request({"gpus": 1}), ["RTX 3090"])
        with pytest.raises(Refused) as e:
            m.admission.admit("ana", [], "", parse_request({"gpus": 1}), ["RTX A6000"])
        return e.value, m.views.me("ana"), catalog(m.inventory, m.settings.min_start_hours)
    finally:
        m.close()


def test_the_card_and_the_refusal_need_the_same_tokens_and_name_the_monthly_credit(tmp_path):
    refusal, me, models = refused_beside_a_running_server(tmp_path, daily=1)
    assert refusal.details["needs"] == "19.500"
    assert ("you already run 1 GPU server costing 2.5 tokens/h (small (2.5/h)), so starting this one needs "
            "19.5 tokens above the floor of \u221210 for the first 3 h of all of them.") in refusal.message
    # +1 on Sunday and Monday is 2 of the 3.5 missing; Tuesday's monthly credit gets there, not the daily one
    assert refusal.details["credit"] == "monthly"
    assert refusal.message.endswith("With the monthly credit you can start it from Tue 1 Dec 2026, 00:00 CET.")
    assert refusal.retry_at == datetime(2026, 11, 30, 23, 0, tzinfo=timezone.utc)
    a6000 = form_context(PROFILES, None, me, models)["profiles"][1]
    assert not a6000.affordable
    assert a6000.needs == ("needs 19.5 tokens above your floor for its first 3 h together with your running "
                           "GPU servers; you have 16")


def test_a_daily_credit_that_suffices_is_named_with_its_own_day(tmp_path):
    refusal, _, _ = refused_beside_a_running_server(tmp_path, daily=5)
    assert refusal.details["credit"] == "daily"
    assert refusal.message.endswith("With the daily credits you can start it from Sun 29 Nov 2026, 00:00 CET.")
    assert "(s)" not in refusal.message


def test_the_spawner_words_the_refusal_again_in_the_viewers_zone(tmp_path):
    from gpupool_hub.spawner.client import allocation_refusal
    from gpupool_hub.spawner.errors import for_viewer

    refusal, _, _ = refused_beside_a_running_server(tmp_path, daily=1)
    answer = {"reason": refusal.reason.value, "message": refusal.message, "details": refusal.details,
              "retry_at": "2026-11-30T23:00:00Z"}

    class Handler:  # the cookie localtime.js sets in the browser
        def __init__(self, zone):
            self.zone = zone

        def get_cookie(self, name):
            return self.zone if name == "gpupool_tz" else None

    tokyo = for_viewer(allocation_refusal(409, answer, "1 GPU"), Handler("Asia%2FTokyo"))  # encodeURIComponent
    assert tokyo.jupyterhub_message.endswith("from Tue 1 Dec 2026, 08:00 JST.")
    assert '<time datetime="2026-11-30T23:00:00Z" data-gpupool-time="year">Tue 1 Dec 2026, 08:00 JST</time>' \
        in tokyo.jupyterhub_html_message
    # the figures are the service's: only the date's zone changed
    assert tokyo.jupyterhub_message.replace("08:00 JST", "00:00 CET") == refusal.message
    # no zone, or one the zone database does not know: the pool's own words (its zone) stay
    for cookie in (None, "../../etc/passwd"):
        assert for_viewer(allocation_refusal(409, answer, "1 GPU"), Handler(cookie)).jupyterhub_message == \
            refusal.message
