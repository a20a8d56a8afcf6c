"""Item 12d: a refusal by the pool is logged by the hub as one INFO/WARNING line, not as an ERROR
with a traceback; real failures keep their level and traceback.

The first test drives a real hub (the module ``hub`` of this package's
conftest: tiny servers, the real service) through the three refusal paths
that JupyterHub logs at ERROR: the spawn form (fast path, with a traceback),
the REST API with a 403 refusal, and "no capacity", whose 503 made the
request line itself an ERROR. The others check the filter on its own.
"""

from __future__ import annotations

import logging
import re
import sys

import pytest

from gpupool_hub.spawner import GPUPoolRefused, invalid_options
from tests.spawner.conftest import allocations, set_balance, spawn, start_ok

pytestmark = pytest.mark.integration

LEVEL = re.compile(r"^\[([DIWEC]) ")


def new_log(hub, offset: int) -> str:
    return hub.log_path.read_bytes()[offset:].decode("utf8", "replace")


def test_12_12d_normal_refusals_are_info_one_liners_in_the_hub_log(hub):
    offset = hub.log_path.stat().st_size
    # the spawn form, refused for the balance (JupyterHub logged it with a traceback)
    set_balance(hub, "rhea", "-9")
    session = hub.login("rhea")
    r = session.post(f"{hub.url}/hub/spawn", data={"profile": "2x3090", "_xsrf": session.xsrf}, timeout=60)
    assert r.status_code == 403 and "Not enough tokens" in r.text
    # the REST API, refused for the balance
    set_balance(hub, "remy", "-9")
    assert spawn(hub, "remy", {"profile": "2x3090"}).status_code == 403
    # no capacity: a 503 (JupyterHub logs 5xx requests at ERROR)
    start_ok(hub, "rolf", {"profile": "4x3090"})
    r = spawn(hub, "rolf", {"profile": "2x3090"}, server="more")
    assert r.status_code == 503 and "No capacity" in r.json()["message"]
    # and an invalid option is the user's mistake, not the hub's
    assert spawn(hub, "remy", {"profile": "no-such"}).status_code == 400

    text = new_log(hub, offset)
    mine = [line for line in text.splitlines() if re.search(r"\b(rhea|remy|rolf)\b", line)]
    errors = [line for line in mine if LEVEL.match(line) and LEVEL.match(line).group(1) in "EC"]
    assert errors == [], "\n".join(errors)
    assert "Traceback" not in text, text[-3000:]
    said = [line for line in mine if line.startswith("[I") and "Not enough tokens" in line]
    assert said, "\n".join(mine)
    assert any(line.startswith("[I") and "No capacity" in line for line in mine), "\n".join(mine)
    assert any(line.startswith("[W") and "503 POST" in line and "rolf" in line for line in mine), "\n".join(mine)
    assert not [a for a in allocations(hub) if a["user"] in ("rhea", "remy")]


# ------------------------------------------------------------ the filter


@pytest.fixture
def log_filter():
    from gpupool_hub.spawner.logs import RefusalLogFilter  # here, so that the hub test needs only the hub

    return RefusalLogFilter()


def record(level: int, msg: str, exc: BaseException | None = None, name: str = "JupyterHub") -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, level, __file__, 1, msg, None, exc_info)


def refusal(reason: str = "insufficient_balance") -> GPUPoolRefused:
    return GPUPoolRefused("Not enough tokens: your balance is -9.0", reason=reason, status_code=403)


def test_12_12d_a_refusal_carried_or_being_handled_becomes_one_info_line(log_filter):
    f = log_filter
    r = record(logging.ERROR, "Failed to spawn single-user server with form", refusal())
    assert f.filter(r) and r.levelno == logging.INFO and r.exc_info is None
    assert r.getMessage() == "Failed to spawn single-user server with form: Not enough tokens: your balance is -9.0"
    try:
        raise refusal()
    except GPUPoolRefused as e:
        r = record(logging.ERROR, f"Not starting alice's server : {e}")
        f.filter(r)
    assert r.levelno == logging.INFO and r.levelname == "INFO"
    try:
        raise invalid_options("unknown profile 'x'")
    except Exception:
        r = record(logging.ERROR, "Error starting alice's server: HTTP 400")
        f.filter(r)
    assert r.levelno == logging.INFO


def test_12_12d_real_failures_keep_their_level_and_traceback(log_filter):
    f = log_filter
    boom = RuntimeError("database exploded")
    r = record(logging.ERROR, "Failed to spawn single-user server with form", boom)
    assert f.filter(r) and r.levelno == logging.ERROR and r.exc_info[1] is boom
    down = refusal("gpupool_unreachable")  # the service did not answer: an outage, not a refusal
    r = record(logging.ERROR, "Not starting alice's server", down)
    f.filter(r)
    assert r.levelno == logging.ERROR and r.exc_info is not None
    assert sys.exc_info()[1] is None


def test_12_12d_the_noted_request_line_is_a_warning_once(log_filter):
    f = log_filter
    request = type("Request", (), {"method": "POST", "path": "/hub/api/users/bo/servers/x"})()
    e = GPUPoolRefused("No capacity for 2 GPUs right now.", reason="no_capacity", status_code=503)
    f.note(e, request)
    line = "503 POST /hub/api/users/bo/servers/x (tester@127.0.0.1) 304.29ms"
    r = record(logging.ERROR, line)
    f.filter(r)
    assert r.levelno == logging.WARNING
    again = record(logging.ERROR, line)  # a later 503 of the same URL is another story
    f.filter(again)
    assert again.levelno == logging.ERROR
    # JupyterHub's "Error starting server …: <message>" is logged outside the except block
    r = record(logging.ERROR, f"Error starting server bo:x: {e}")
    f.filter(r)
    assert r.levelno == logging.INFO
