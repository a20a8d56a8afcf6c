"""``GPUPOOL_TEST_LOAD``: the busy-machine mode spins N processes beside the tests marked ``loaded``, only there.

A small pytest session runs in a subprocess with the mode on: one module
marked ``loaded`` whose module-scoped fixture (a stand-in for a hub) and
tests record the busy processes they see, and one unmarked module that must
see none. Afterwards every busy process is gone.
"""

from __future__ import annotations

import json
import os
import time
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFTEST = 'pytest_plugins = ["tests.load"]\n'

LOADED = '''
import json, os, pytest
pytestmark = pytest.mark.loaded

def spinning():
    """pids of this session's busy processes: its children running the load's loop."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if cmd[1:2] == [b"-c"] and cmd[2].startswith(b"import os") and b"while" in cmd[2]:
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == os.getpid():
                found.append(int(entry))
    return sorted(found)

@pytest.fixture(scope="module")
def hub():
    return spinning()

def test_a(hub):
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps({"module_fixture": hub, "test": spinning()}) + "\\n")
    if os.environ.get("DIE"):  # pytest killed before any teardown runs
        os.kill(os.getpid(), 9)
'''

QUIET = '''
import json, os
from test_loaded import spinning

def test_b():
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps({"quiet": spinning()}) + "\\n")
'''


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_session(tmp_path: Path, load: str, die: bool = False) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_loaded.py").write_text(textwrap.dedent(LOADED))
    (tmp_path / "test_quiet.py").write_text(textwrap.dedent(QUIET))
    record = tmp_path / "record.jsonl"
    env = {**os.environ, "GPUPOOL_TEST_LOAD": load, "RECORD": str(record),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]), "DIE": "1" if die else ""}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore",
                           "test_loaded.py", "test_quiet.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return proc, lines


def test_load_runs_beside_marked_modules_only_and_is_gone_after(tmp_path):
    proc, [loaded, quiet] = run_session(tmp_path, "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPUPOOL_TEST_LOAD=2" in proc.stdout  # the header says the run was loaded
    assert len(loaded["module_fixture"]) == 2, loaded  # already there when the module's hub starts
    assert loaded["test"] == loaded["module_fixture"]
    assert quiet["quiet"] == []
    for pid in loaded["test"]:
        assert not running(pid), f"busy process {pid} outlived the session"


def test_no_load_when_unset_and_a_clear_error_for_a_bad_value(tmp_path):
    proc, [loaded, quiet] = run_session(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert loaded["module_fixture"] == [] and quiet["quiet"] == []

    bad = tmp_path / "bad"
    bad.mkdir()
    proc, lines = run_session(bad, "two")
    assert proc.returncode != 0 and lines == []
    assert "GPUPOOL_TEST_LOAD='two'" in proc.stdout + proc.stderr


def test_the_load_ends_with_pytest_even_when_pytest_is_killed(tmp_path):
    proc, [loaded] = run_session(tmp_path, "2", die=True)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert len(loaded["test"]) == 2
    deadline = time.monotonic() + 10
    while any(map(running, loaded["test"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in loaded["test"] if running(pid)]
    assert left == [], f"busy processes {left} outlived a killed pytest"
