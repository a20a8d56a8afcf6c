"""Work saved before GPUs are taken (issue 25.5), in a real JupyterLab in headless Chromium.

A notebook is opened and edited, and left unsaved (JupyterLab's own autosave is
turned off, so only the widget can save it). Then the pool's ``GET me`` (the
stand-in service, polled every second) starts a reclaim countdown: the widget
saves the notebook to disk within a few seconds and says so. With the
``saveBeforeStop`` setting off, the warning reaches the widget, which says that
nothing is saved for the user, and the file on disk keeps its old content.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fixtures.hub import wait_for

from .browser import LAB_TIMEOUT_MS, open_panel, screenshot_widget, wait_for_status_item
from .servers import PLUGIN_ID, JupyterProcess
from .standin import SERVER_TOKEN, StandInService, cull_in

pytestmark = pytest.mark.integration

SCREENSHOT = Path(__file__).parents[2] / "build" / "screenshots" / "widget-saved.png"
NOTEBOOK = "work.ipynb"
EDIT = "# edited, not saved by hand"
RECLAIM = ("your borrowed GPUs on node-b (server default) are reclaimed for team vision, "
           "which is within its quota; the server stops at the deadline")
#: "within a few seconds": one poll (1 s), the save, and slack for two busy cores
SAVED_WITHIN_S = 8.0


def notebook_json(source: str) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {},
                       "outputs": [], "source": source}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def cell_source(path: Path) -> str:
    cell = json.loads(path.read_text())["cells"][0]
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.fixture
def standin():
    with StandInService() as service:
        yield service


def start_lab(tmp_path: Path, standin: StandInService, save: bool) -> JupyterProcess:
    env = {"GPUPOOL_API_URL": standin.api_url, "JUPYTERHUB_API_TOKEN": SERVER_TOKEN}
    proc = JupyterProcess(tmp_path / "lab", app="lab", env=env, settings={
        PLUGIN_ID: {"pollInterval": 1, "saveBeforeStop": save},
        # only the widget may save: JupyterLab's autosave (every 120 s) is off
        "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
    })
    proc.root.mkdir(parents=True, exist_ok=True)
    (proc.root / NOTEBOOK).write_text(json.dumps(notebook_json("x = 1")))
    return proc.start()


def edit_notebook(page, lab: JupyterProcess) -> None:
    """Open the notebook, type into its cell, and check that JupyterLab marks it unsaved."""
    from playwright.sync_api import expect

    page.goto(f"{lab.url}lab/tree/{NOTEBOOK}?token={lab.token}", wait_until="domcontentloaded")
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    expect(editor).to_be_visible(timeout=LAB_TIMEOUT_MS)
    editor.click()
    page.keyboard.press("End")
    page.keyboard.type(f"\n{EDIT}")
    expect(page.locator(".jp-mod-current.jp-mod-dirty, .lm-TabBar-tab.jp-mod-current.jp-mod-dirty").first
           ).to_be_visible()


@pytest.mark.parametrize("save", [True, False], ids=["setting-on", "setting-off"])
def test_unsaved_notebook_is_saved_when_a_reclaim_warning_arrives(tmp_path, standin, browser_page, save):
    from playwright.sync_api import expect

    page = browser_page
    lab = start_lab(tmp_path, standin, save)
    file = lab.root / NOTEBOOK
    try:
        edit_notebook(page, lab)
        item = wait_for_status_item(page, "46.0 tokens", state="fine")
        assert cell_source(file) == "x = 1"  # nothing saved it yet

        standin.set_me(cull_warning=cull_in(10, reason=RECLAIM))
        warned = time.monotonic()
        expect(item).to_contain_text("server stops in 9:", timeout=SAVED_WITHIN_S * 1000)
        if save:
            wait_for(lambda: EDIT in cell_source(file), SAVED_WITHIN_S, "the notebook saved on disk", interval=0.1)
            took = time.monotonic() - warned
            expect(item).to_have_attribute("data-saved", "saved")
            expect(item).to_contain_text("work saved")
            panel = open_panel(page)
            note = panel.locator("[data-gpupool='saved']")
            expect(note).to_contain_text("Open documents saved at")
            expect(note).to_contain_text("(1 document saved); saved again 30 s before the stop.")
            page.wait_for_timeout(300)  # let the popup settle before the picture
            screenshot_widget(page, SCREENSHOT)
            print(f"saved {took:.1f} s after the warning was served")
        else:
            expect(item).to_have_attribute("data-saved", "off")
            expect(item).to_contain_text("saving off")
            # the widget would have saved when it showed the warning; give it two more polls
            seen = len(standin.requests)
            wait_for(lambda: len(standin.requests) >= seen + 2, SAVED_WITHIN_S, "two more polls")
            assert EDIT not in cell_source(file)
            expect(page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").first).to_be_visible()
            panel = open_panel(page)
            expect(panel.locator("[data-gpupool='saved']")).to_contain_text("turned off in the settings")
    except Exception:
        console = "\n".join(getattr(page, "gpupool_console", []))
        print(f"--- browser console ---\n{console}\n--- jupyter lab log ---\n{lab.log()}")
        page.screenshot(path=str(lab.tmp_path / "failure.png"))
        raise
    finally:
        lab.stop()
