"""The pending stop of this server, for code that trains: ``deadline()`` and ``seconds_left()``.

When the pool is about to take a server's GPUs (a team reclaims borrowed GPUs,
someone waits for an idle server's GPUs, a negative balance under pressure has
its kernels culled), the user sees a countdown in the JupyterLab widget. A
training loop cannot see the widget, so the countdown is also a small JSON
file: the spawner names it in ``GPUPOOL_NOTICE_FILE``, and the server
extension in the single-user server (:mod:`gpupool_hub.labext.noticefile`)
keeps it current from the pool's ``GET me``. The file exists only while a stop
is pending; a loop that checks :func:`seconds_left` between steps can
checkpoint before the GPUs go::

    from gpupool_hub.notice import seconds_left

    for step in range(steps):
        train_one_step()
        left = seconds_left()
        if left is not None and left < 120:
            save_checkpoint(); break

Reading is a ``stat`` and a small read, cheap enough for every step. The file
is replaced whole (write, then rename), so a reader never sees half of it.

The module also holds the pure rule of which countdown concerns a server
(:func:`pending_notice`), so the writer and its tests agree on it.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import strictjson

#: set by the spawner: where the pending deadline of this server is written
NOTICE_FILE_ENV = "GPUPOOL_NOTICE_FILE"
#: set by the spawner on a server with GPUs: the pool's allocation id
ALLOCATION_ENV = "GPUPOOL_ALLOCATION"
#: the file's format; a reader refuses a newer one rather than misread it
VERSION = 1


def notice_path(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The notice file: ``path``, else ``$GPUPOOL_NOTICE_FILE`` (``~`` expanded); None when unset."""
    value = os.fspath(path) if path is not None else os.environ.get(NOTICE_FILE_ENV, "").strip()
    return Path(value).expanduser() if value else None


def read_notice(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The pending stop as written (``deadline``, ``action``, ``reason``, ``kind``, ``server``),
    or None when nothing is pending (no file) or the variable is unset.

    A file that cannot be understood gives a warning naming it and None: a training loop
    must not die hours in because of it."""
    file = notice_path(path)
    if file is None:
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.warn(f"gpupool notice file {file} cannot be read: {e}", RuntimeWarning, stacklevel=2)
        return None
    try:
        notice = strictjson.loads(text)
        if not isinstance(notice, dict) or int(notice.get("version", 0)) > VERSION:
            raise ValueError("not a gpupool notice of a version this gpupool_hub reads")
        parse_instant(notice["deadline"])
    except (ValueError, KeyError, TypeError) as e:
        warnings.warn(f"gpupool notice file {file} is not a notice ({e}); ignored", RuntimeWarning, stacklevel=2)
        return None
    return notice


def deadline(path: str | os.PathLike[str] | None = None) -> datetime | None:
    """When this server's GPUs are taken (UTC), or None when no stop is pending."""
    notice = read_notice(path)
    return None if notice is None else parse_instant(notice["deadline"])


def seconds_left(path: str | os.PathLike[str] | None = None, now: datetime | None = None) -> float | None:
    """Seconds until this server's GPUs are taken (0 once past), or None when no stop is pending."""
    at = deadline(path)
    if at is None:
        return None
    return max(0.0, (at - (now or datetime.now(timezone.utc))).total_seconds())


def parse_instant(value: Any) -> datetime:
    """An API instant (``2026-11-21T10:00:00Z``) as an aware datetime; ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"an instant must be a string, got {value!r}")
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError(f"an instant needs its time zone: {value!r}")
    return at.astimezone(timezone.utc)


def pending_notice(me: Mapping[str, Any], allocation: str, server: str) -> dict[str, Any] | None:
    """What this server is warned of, from the pool's ``GET me``; None when nothing is pending.

    Only a server that holds GPUs (``allocation``, the spawner's ``GPUPOOL_ALLOCATION``)
    loses anything. An idle stop names its server: ``gpu_servers[].reclaim_deadline`` of
    this allocation, and an idle warning of another server is not this server's. A
    reclaim of borrowed GPUs and a kernel cull are warned per user (``cull_warning``): they
    concern every GPU server of the user, so a second server checkpoints once too often
    rather than once too few. A warning already carried out (``done_at``) is not pending."""
    if not allocation:
        return None
    servers = [s for s in me.get("gpu_servers") or [] if isinstance(s, Mapping)]
    mine = next((s for s in servers if s.get("allocation") == allocation), None)
    warning = me.get("cull_warning")
    found = []
    if mine is not None and mine.get("reclaim_deadline"):
        said = warning.get("reason") if isinstance(warning, Mapping) and warning.get("deadline") == \
            mine["reclaim_deadline"] else None
        found.append(_notice(mine["reclaim_deadline"], "server", "idle",
                             said or "your server's GPUs are idle and someone is waiting for them", server))
    if isinstance(warning, Mapping) and warning.get("deadline") and not warning.get("done_at"):
        action = str(warning.get("action") or "server")
        idle_stops = {s.get("reclaim_deadline") for s in servers if s.get("reclaim_deadline")}
        if not (action == "server" and warning["deadline"] in idle_stops):  # an idle stop: seen above, or not ours
            found.append(_notice(warning["deadline"], action, "kernels" if action == "kernels" else "reclaim",
                                 str(warning.get("reason") or ""), server))
    return min(found, key=lambda n: parse_instant(n["deadline"]), default=None)


def _notice(at: str, action: str, kind: str, reason: str, server: str) -> dict[str, Any]:
    return {"version": VERSION, "deadline": at, "action": action, "kind": kind, "reason": reason,
            "server": server}


def write_notice(path: Path, notice: Mapping[str, Any] | None) -> bool:
    """Make the file say ``notice`` (None: remove it); True when it changed.

    Written to a temporary file in the same folder and renamed over the old one, so
    that a reader sees the old notice or the new one, never a part."""
    if notice is None:
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True
    text = json.dumps(dict(notice), sort_keys=True) + "\n"
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
