"""gpupool_hub.notice: which countdown concerns a server, and the file a training loop reads."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpupool_hub.notice import (
    NOTICE_FILE_ENV, deadline, pending_notice, read_notice, seconds_left, write_notice,
)
from gpupool_hub.spawner.memory_hints import notice_file_env

T1 = "2026-11-21T10:10:00Z"
T2 = "2026-11-21T10:20:00Z"


def server(allocation: str, stop: str | None) -> dict:
    return {"allocation": allocation, "server": "", "reclaim_deadline": stop}


def warning(at: str, action: str = "server", reason: str = "reclaimed for team vision", done: str | None = None):
    return {"action": action, "reason": reason, "deadline": at, "done_at": done}


@pytest.mark.parametrize(("me", "allocation", "deadline_", "kind"), [
    # nothing pending
    ({"cull_warning": None, "gpu_servers": [server("a1", None)]}, "a1", None, None),
    # a server without GPUs loses nothing
    ({"cull_warning": warning(T1), "gpu_servers": []}, "", None, None),
    # this server idles while someone waits (the warning of GET me names the same stop)
    ({"cull_warning": warning(T1, reason="idle 2 h"), "gpu_servers": [server("a1", T1)]}, "a1", T1, "idle"),
    # another server of the user idles: not this one's stop
    ({"cull_warning": warning(T1, reason="idle 2 h"), "gpu_servers": [server("a1", None), server("a2", T1)]},
     "a1", None, None),
    # a reclaim of borrowed GPUs (per user): every GPU server of the user
    ({"cull_warning": warning(T2), "gpu_servers": [server("a1", None)]}, "a1", T2, "reclaim"),
    # a kernel cull under pressure
    ({"cull_warning": warning(T2, action="kernels"), "gpu_servers": []}, "a1", T2, "kernels"),
    # carried out already: nothing pending
    ({"cull_warning": warning(T1, action="kernels", done=T1), "gpu_servers": []}, "a1", None, None),
    # an idle stop and a sooner kernel cull: the sooner one
    ({"cull_warning": warning(T1, action="kernels"), "gpu_servers": [server("a1", T2)]}, "a1", T1, "kernels"),
    # an older service without gpu_servers
    ({"cull_warning": warning(T2)}, "a1", T2, "reclaim"),
], ids=["none", "cpu-server", "idle-mine", "idle-other", "reclaim", "kernels", "done", "soonest", "old-service"])
def test_which_countdown_concerns_this_server(me, allocation, deadline_, kind):
    notice = pending_notice(me, allocation, "big")
    if deadline_ is None:
        assert notice is None
    else:
        assert notice is not None
        assert (notice["deadline"], notice["kind"], notice["server"]) == (deadline_, kind, "big")


def test_the_idle_notice_carries_the_pools_reason():
    me = {"cull_warning": warning(T1, reason="idle 2 h; alice waits for an RTX 3090"),
          "gpu_servers": [server("a1", T1)]}
    assert pending_notice(me, "a1", "")["reason"] == "idle 2 h; alice waits for an RTX 3090"


def test_written_then_read_back_through_the_variable(tmp_path: Path, monkeypatch):
    path = tmp_path / "deep" / "notice-default.json"
    monkeypatch.setenv(NOTICE_FILE_ENV, str(path))
    assert deadline() is None and seconds_left() is None  # no file: nothing pending
    notice = pending_notice({"cull_warning": warning(T2), "gpu_servers": []}, "a1", "")
    assert write_notice(path, notice) is True
    assert write_notice(path, notice) is False  # the same notice: the file is not touched
    assert deadline() == datetime(2026, 11, 21, 10, 20, tzinfo=timezone.utc)
    assert seconds_left(now=datetime(2026, 11, 21, 10, 18, tzinfo=timezone.utc)) == 120
    assert seconds_left(now=datetime(2026, 11, 21, 11, 0, tzinfo=timezone.utc)) == 0
    assert read_notice()["reason"] == "reclaimed for team vision"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert write_notice(path, None) is True and not path.exists()
    assert write_notice(path, None) is False
    assert deadline() is None


def test_no_variable_no_deadline(monkeypatch):
    monkeypatch.delenv(NOTICE_FILE_ENV, raising=False)
    assert deadline() is None and read_notice() is None


@pytest.mark.parametrize("text", ["{not json", json.dumps({"deadline": "tomorrow"}), json.dumps([1]),
                                  json.dumps({"version": 99, "deadline": T1})])
def test_a_file_that_is_not_a_notice_warns_and_gives_none(tmp_path: Path, text: str):
    path = tmp_path / "notice.json"
    path.write_text(text)
    with pytest.warns(RuntimeWarning, match=str(path)):
        assert deadline(path) is None


def test_a_naive_time_is_refused(tmp_path: Path):
    path = tmp_path / "notice.json"
    path.write_text(json.dumps({"deadline": (datetime.now() + timedelta(minutes=5)).isoformat()}))
    with pytest.warns(RuntimeWarning, match="time zone"):
        assert deadline(path) is None


@pytest.mark.parametrize(("template", "name", "value"), [
    ("~/.gpupool/notice-{server}.json", "", "~/.gpupool/notice-default.json"),
    ("~/.gpupool/notice-{server}.json", "big gpu", "~/.gpupool/notice-big%20gpu.json"),
    ("/scratch/{server}.json", "../../etc", "/scratch/..%2F..%2Fetc.json"),
    ("/scratch/{server}", "..", "/scratch/%2E%2E"),
])
def test_the_spawner_names_the_file_inside_its_folder(template, name, value):
    assert notice_file_env(template, name) == {NOTICE_FILE_ENV: value}


def test_an_empty_setting_sets_no_variable():
    assert notice_file_env("", "big") == {}
