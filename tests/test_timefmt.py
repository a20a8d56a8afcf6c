"""One wording of a date for people (issue 39.5): the pool's zone as the server's fallback, the
viewer's zone in the browser, always with the zone; never UTC ISO on a page."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from gpupool_hub.spawner.form import localtime_script
from gpupool_hub.timefmt import ZONE_COOKIE, time_html, time_zone, when_text

MIDNIGHT_BERLIN = datetime(2026, 12, 1, tzinfo=ZoneInfo("Europe/Berlin"))


def test_a_date_reads_with_its_weekday_and_its_zone():
    assert when_text(MIDNIGHT_BERLIN, ZoneInfo("Europe/Berlin")) == "Tue 1 Dec 2026, 00:00 CET"
    assert when_text(MIDNIGHT_BERLIN) == "Mon 30 Nov 2026, 23:00 UTC"  # no zone given: UTC, said so
    assert when_text(MIDNIGHT_BERLIN, ZoneInfo("America/New_York")) == "Mon 30 Nov 2026, 18:00 EST"
    # a zone whose only name is an offset reads as one
    assert when_text(MIDNIGHT_BERLIN, ZoneInfo("America/Sao_Paulo")) == "Mon 30 Nov 2026, 20:00 UTC-03:00"
    summer = datetime(2026, 7, 1, 12, tzinfo=timezone.utc)
    assert when_text(summer, ZoneInfo("Europe/Berlin")) == "Wed 1 Jul 2026, 14:00 CEST"


def test_the_html_form_carries_the_instant_for_the_browser_and_the_words_for_everyone_else():
    html = time_html(MIDNIGHT_BERLIN, ZoneInfo("Europe/Berlin"))
    assert html == ('<time datetime="2026-11-30T23:00:00Z" data-gpupool-time="year">'
                    "Tue 1 Dec 2026, 00:00 CET</time>")
    assert 'data-gpupool-time="date"' in time_html(MIDNIGHT_BERLIN, fmt="%-d %b %Y")
    assert "&lt;b&gt;" in time_html(MIDNIGHT_BERLIN, text="<b>")  # words are escaped
    # the browser script rewrites exactly these elements and names the cookie the hub reads
    js = str(localtime_script())
    assert "time[data-gpupool-time]" in js and f"{ZONE_COOKIE}=" in js and "timeZoneName" in js


def test_only_a_zone_the_database_knows_is_taken_from_the_browser():
    assert time_zone("Asia/Tokyo") == ZoneInfo("Asia/Tokyo")
    for bad in ("", None, "../../etc/passwd", "Mars/Olympus", "Europe/Berlin; rm", "x" * 100):
        assert time_zone(bad) is None
