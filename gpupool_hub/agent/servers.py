"""Which processes are the single-user servers the hub started: the records written at spawn.

Enforcement leaves a Jupyter kernel of a running server to the hub (it culls kernels
through Jupyter, so the user sees a dead kernel with a reason). Which process is such
a server used to be read from its command line (``jupyter-lab``, ``jupyterhub-singleuser``),
which every user writes: a GPU job started under a script named ``jupyter-lab`` was
skipped by the out-of-tokens stop. Now a server is a process the spawner recorded when it
started it, and a kernel belongs to a running server only when it descends from one.

``gpupool-localprocess`` (the hub's spawner, as root) writes one record per server into
``<directory>/<pid>.json`` as it starts (pid, owner, start time) and removes it at stop; the
agent on the same host reads the directory. The pid is the hub's own record of the server
(the spawner's ``pid`` state), so only spawners that start the server as a process of this
host record one: on Slurm or Kubernetes nodes no server is recorded, and every GPU process
of a user the service names is stopped, kernels included (the service names a user only
after the hub culled their kernels or stopped their server).

What the agent trusts: a directory and files owned by root (or the agent's own user) that
nobody else may write, and a record whose process is alive with the recorded start time and
owner (a reused pid is not the server). Anything else is ignored, with one warning.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import psutil

from .. import strictjson

log = logging.getLogger("gpupool.agent.servers")

#: where ``gpupool-localprocess`` records its servers and the agent reads them (both configurable)
RECORD_DIR = "/run/gpupool-servers"
#: a start time read twice (by the spawner, then the agent) may differ by rounding only
SAME_START = 0.01
_MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class ServerRecord:
    """One server the hub started: its pid, owner (real uid) and start time, against pid reuse."""

    pid: int
    uid: int
    user: str
    server: str
    started: float

    def is_process(self, proc: psutil.Process) -> bool:
        """Whether ``proc`` is still this server (same pid, start time and owner, not a zombie)."""
        try:
            return (proc.pid == self.pid and abs(proc.create_time() - self.started) < SAME_START
                    and proc.uids().real == self.uid and proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False


# ------------------------------------------------------------ the spawner's side


def record_server(directory: str, pid: int, user: str, server: str = "") -> Path:
    """The spawner started ``pid`` as ``user``'s server: write its record (atomically; the
    directory is made root's, 0755, if missing). Records of processes gone are removed on the way.
    Raises ``OSError`` (or ``psutil.Error`` when ``pid`` is already gone)."""
    proc = psutil.Process(pid)
    body = json.dumps({"pid": pid, "uid": proc.uids().real, "user": user, "server": server,
                       "started": proc.create_time()}).encode()
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if not _trusted(os.lstat(directory)):  # the agent would ignore it: say so where the spawner logs
        raise PermissionError(f"{directory} is not root's, or others may write it: the node agent ignores it")
    _forget_gone(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".record-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.chmod(tmp, 0o644)
        target = Path(directory) / f"{pid}.json"
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def forget_server(directory: str, pid: int) -> None:
    """The server ``pid`` stopped: remove its record (if any)."""
    (Path(directory) / f"{pid}.json").unlink(missing_ok=True)


def _forget_gone(directory: str) -> None:
    """Remove records whose server is gone without a stop (the hub died meanwhile)."""
    for pid, record in read_records(directory).items():
        try:
            alive = record.is_process(psutil.Process(pid))
        except psutil.Error:
            alive = False
        if not alive:
            forget_server(directory, pid)


# ------------------------------------------------------------ the agent's side


def _trusted(st: os.stat_result) -> bool:
    """Owned by root (or this process's user) and writable by nobody else."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_records(directory: str, problems: list[str] | None = None) -> dict[int, ServerRecord]:
    """The trusted records in ``directory`` by pid (empty when it does not exist: no local spawner
    here); what is ignored, and why, is added to ``problems``."""
    problems = [] if problems is None else problems
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return {}
    except OSError as e:
        problems.append(f"cannot read {directory}: {e.strerror}")
        return {}
    if not stat.S_ISDIR(st.st_mode) or not _trusted(st):
        problems.append(f"{directory} is not a directory of root's that only root may write "
                        f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        return {}
    records: dict[int, ServerRecord] = {}
    for entry in os.scandir(directory):
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        record = _read_record(entry.path)
        if record is not None and entry.name == f"{record.pid}.json":
            records[record.pid] = record
        else:
            problems.append(f"{entry.path} is not root's, may be written by others, or is malformed")
    return records


def _read_record(path: str) -> ServerRecord | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st):
            return None
        data = strictjson.loads(os.read(fd, _MAX_RECORD_BYTES))
        return ServerRecord(int(data["pid"]), int(data["uid"]), str(data["user"]), str(data.get("server", "")),
                            float(data["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


class ServerRecords:
    """The agent's view of one record directory, read afresh at each look (servers come and go);
    each problem with it is logged once, not at every tick."""

    def __init__(self, directory: str = RECORD_DIR) -> None:
        self.directory = directory
        self._logged: set[str] = set()

    def load(self) -> dict[int, ServerRecord]:
        if not self.directory:
            return {}
        problems: list[str] = []
        records = read_records(self.directory, problems)
        for problem in problems:
            if problem not in self._logged:
                self._logged.add(problem)
                log.warning("Ignoring a record of the hub's servers (%s): kernels under that server count as "
                            "the user's own processes when enforcing", problem)
        return records


def recorded_server_of(pid: int, uid: int | None, records: Mapping[int, ServerRecord]) -> int | None:
    """Pid of the recorded, still running server of ``uid`` that ``pid`` descends from, if any.

    A kernel whose server died is re-parented (to init or a subreaper) and has no such
    ancestor: nobody will cull it through Jupyter. A process under a program that merely
    calls itself a Jupyter server has none either."""
    if uid is None or not records:
        return None
    try:
        parents = psutil.Process(pid).parents()
    except psutil.Error:
        return None
    for parent in parents:
        record = records.get(parent.pid)
        if record is not None and record.uid == uid and record.is_process(parent):
            return parent.pid
    return None
