"""Screenshots: the tests write them where the tests own the files, never into docs/.

Item 12c of issue 12: running the suite rewrote the tracked ``docs/images/widget.png``
and ``docs/images/widget-hub.png``. The browser tests now save under
``build/screenshots/`` (git-ignored) and ``scripts/update-screenshots.sh`` copies
every PNG found there into ``docs/images/``. The script runs here on temporary
folders (``SCREENSHOTS``/``DOCS_IMAGES``), so this test changes no tracked file either.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.e2e import test_widget_hub
from tests.labext import test_browser

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "update-screenshots.sh"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def git_ignored(path: Path) -> bool:
    r = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, check=False)
    return r.returncode == 0


def test_12_12c_browser_tests_write_screenshots_under_build_not_docs():
    for module in (test_browser, test_widget_hub):
        shot = module.SCREENSHOT.resolve()
        assert shot.is_relative_to(REPO / "build" / "screenshots"), (module.__name__, shot)
        assert not shot.is_relative_to(REPO / "docs"), (module.__name__, shot)
        assert git_ignored(shot), f"{shot} would be tracked by git"


def test_12_12c_update_screenshots_copies_every_png_from_build(tmp_path):
    shots, images = tmp_path / "shots", tmp_path / "images"
    (shots / "pages").mkdir(parents=True)
    images.mkdir()
    (shots / "widget.png").write_bytes(PNG + b"w")
    (shots / "widget-hub.png").write_bytes(PNG + b"h")
    (shots / "pages" / "my-usage.png").write_bytes(PNG + b"p")
    (shots / "notes.txt").write_text("not a picture")
    env = {**os.environ, "SCREENSHOTS": str(shots), "DOCS_IMAGES": str(images)}
    r = subprocess.run(["bash", str(SCRIPT), "--no-run"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in images.iterdir()) == ["pages-my-usage.png", "widget-hub.png", "widget.png"]
    assert (images / "pages-my-usage.png").read_bytes() == PNG + b"p"
    assert (images / "widget.png").read_bytes() == PNG + b"w"


def test_12_12c_update_screenshots_says_when_there_is_nothing_to_copy(tmp_path):
    env = {**os.environ, "SCREENSHOTS": str(tmp_path / "none"), "DOCS_IMAGES": str(tmp_path / "images")}
    r = subprocess.run(["bash", str(SCRIPT), "--no-run"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "run without --no-run" in r.stderr
