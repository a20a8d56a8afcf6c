"""The user guide quotes what users see: the widget's words and the notices' titles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupool_hub.service.core.takeback_notices import KINDS

ROOT = Path(__file__).parents[2]
GUIDE = (ROOT / "docs" / "user-guide.md").read_text()
TS = ROOT / "labextension" / "src"


def ts_constant(source: str, name: str) -> str:
    """An exported string constant of a TypeScript module ('a' + 'b' concatenations joined)."""
    m = re.search(rf"export const {name} =\s*((?:'[^']*'\s*\+?\s*)+);", source)
    assert m, f"{name} not found"
    return "".join(re.findall(r"'([^']*)'", m.group(1)))


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", ["KERNELS_STOPPED", "KERNELS_STOPPED_DETAIL", "DISMISS"])
def test_guide_quotes_the_widget_after_a_cull(name):
    assert ts_constant((TS / "notices.ts").read_text(), name) in flat(GUIDE)


def test_guide_quotes_the_countdowns_as_the_widget_words_them():
    source = (TS / "format.ts").read_text()
    server, kernels = re.search(r"'server' \? '([^']+)' : '([^']+)'", source).groups()
    assert f"⚠ {server} in" in GUIDE and f"⚠ {kernels} in" in GUIDE
    # the cull warning (action "kernels") is titled with the kernels' countdown, not the server's
    assert re.search(rf'### "⚠ {kernels} in [0-9:]+" — a cull warning', GUIDE)


@pytest.mark.parametrize("action", sorted(KINDS))
def test_guide_quotes_every_notice(action):
    kind = KINDS[action]
    guide = flat(GUIDE)
    assert f'"{kind.what}" … "{kind.because}"' in guide  # the table's words, the time between them
    assert kind.kept in guide


def test_guide_quotes_the_floor_stop_as_the_page_and_widget_word_it():
    from gpupool_hub.service.core.takeback_notices import FLOOR_WHY

    guide = flat(GUIDE)
    assert FLOOR_WHY in guide
    assert "Your GPU server was stopped at 14:02 because your balance reached the floor (−10 tokens)" in guide
    notices = (TS / "notices.ts").read_text()
    assert flat(ts_constant(notices, "FLOOR_STOP_DETAIL")) in guide
