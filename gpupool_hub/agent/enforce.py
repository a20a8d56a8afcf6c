"""Stopping the GPU processes of users the service names (e.g. out of tokens).

Rules, in the order they are checked (each refusal is logged and counted):

* only processes NVML lists on a GPU of this node, owned (real uid) by a
  named user: the agent never hunts through the whole process table;
* never uid 0, never a uid below ``min_uid`` (system accounts; default 1000),
  never the agent itself or its ancestors;
* never a Jupyter kernel whose server is still running, unless the service
  lists the user under ``kernels``: those are stopped through Jupyter by the
  hub's culling (so the user sees a dead kernel, not a vanished one); an
  orphaned kernel (its server gone) has nobody to stop it but us; the boundary
  guard (``boundary.py``) and the memory guard stop kernels too: a kernel on a
  GPU its user holds nothing of, or over its share, is not the hub's to cull;
* the pid is re-read just before signalling; if its start time or owner
  changed (pid reuse) it is left alone.

Signals go by pid through psutil (``kill(2)``), never through a shell: SIGTERM,
then SIGKILL to whatever still runs after ``grace`` seconds. Dry-run only logs
what it would do.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

import psutil

from .attribution import GpuProcess, Snapshot

log = logging.getLogger("gpupool.agent.enforce")

TERMINATED = "terminated"   # exited within the grace after SIGTERM
KILLED = "killed"           # needed SIGKILL
WOULD_TERMINATE = "would_terminate"  # dry run
GONE = "gone"               # exited before we signalled it
SKIPPED_ROOT = "skipped_root"
SKIPPED_SYSTEM = "skipped_system_user"
SKIPPED_KERNEL = "skipped_kernel"
SKIPPED_SELF = "skipped_self"
SKIPPED_CHANGED = "skipped_changed"  # pid reused or owner changed since the snapshot
FAILED = "failed"


@dataclass(frozen=True)
class Action:
    """What enforcement did (or would do) to one process."""

    pid: int
    user: str
    uid: int | None
    gpu_uuids: tuple[str, ...]
    action: str
    detail: str = ""


def _protected_pids() -> set[int]:
    """The agent and its ancestors: killing those would stop enforcement itself."""
    pids = {os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return pids


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Enforcer:
    """Applies the service's enforcement list to one snapshot of GPU processes."""

    def __init__(self, *, min_uid: int = 1000, grace: float = 10.0, dry_run: bool = False,
                 poll: float = 0.1) -> None:
        if min_uid < 1:
            raise ValueError("min_uid must be at least 1: root is never enforced")
        self.min_uid = min_uid
        self.grace = grace
        self.dry_run = dry_run
        self.poll = poll

    def _check(self, proc: GpuProcess, kernel_users: Collection[str], protected: set[int]) -> str | None:
        """Why ``proc`` must be left alone, or ``None`` when it may be stopped."""
        if proc.uid == 0:
            return SKIPPED_ROOT
        if proc.uid is None or proc.uid < self.min_uid:
            return SKIPPED_SYSTEM
        if proc.pid in protected:
            return SKIPPED_SELF
        if proc.is_kernel_of_running_server and proc.user not in kernel_users:
            return SKIPPED_KERNEL
        return None

    def _verify(self, proc: GpuProcess) -> psutil.Process | None:
        """The live process, if it is still the one the snapshot saw."""
        try:
            p = psutil.Process(proc.pid)
            if proc.create_time is not None and abs(p.create_time() - proc.create_time) > 0.01:
                return None
            if p.uids().real != proc.uid:
                return None
            return p
        except psutil.Error:
            return None

    def enforce(self, snapshot: Snapshot, users: Iterable[str], kernel_users: Iterable[str] = (),
                *, dry_run: bool | None = None) -> list[Action]:
        """Stop the named users' GPU processes; returns one :class:`Action` per process considered."""
        users = set(users)
        kernel_users = set(kernel_users)
        dry = self.dry_run if dry_run is None else (dry_run or self.dry_run)
        if not users:
            return []
        protected = _protected_pids()
        # A process on several GPUs is one process: gather its GPUs, act once.
        targets: dict[int, tuple[GpuProcess, list[str]]] = {}
        for proc in snapshot.processes:
            if proc.user is None or proc.user not in users:
                continue
            if proc.pid in targets:
                targets[proc.pid][1].append(proc.gpu_uuid)
            else:
                targets[proc.pid] = (proc, [proc.gpu_uuid])
        actions: list[Action] = []
        signalled: list[tuple[GpuProcess, tuple[str, ...], psutil.Process]] = []
        for proc, gpus in targets.values():
            uuids = tuple(gpus)
            user = proc.user or ""
            refusal = self._check(proc, kernel_users, protected)
            if refusal is not None:
                log.info("Not stopping pid %d of %s (%s)", proc.pid, user, refusal)
                actions.append(Action(proc.pid, user, proc.uid, uuids, refusal))
                continue
            live = self._verify(proc)
            if live is None:
                detail = "pid exited or was reused since the snapshot"
                actions.append(Action(proc.pid, user, proc.uid, uuids, SKIPPED_CHANGED, detail))
                continue
            what = "kernel " + (proc.kernel_id or "") if proc.is_kernel else "process"
            if dry:
                log.warning("DRY RUN: would stop %s pid %d of %s on %s: %s", what, proc.pid, user,
                            ", ".join(uuids), " ".join(proc.cmdline)[:200])
                actions.append(Action(proc.pid, user, proc.uid, uuids, WOULD_TERMINATE))
                continue
            try:
                live.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                actions.append(Action(proc.pid, user, proc.uid, uuids, GONE))
                continue
            except psutil.Error as e:
                log.error("Cannot signal pid %d of %s: %s", proc.pid, user, e)
                actions.append(Action(proc.pid, user, proc.uid, uuids, FAILED, str(e)))
                continue
            log.warning("Sent SIGTERM to %s pid %d of %s on %s", what, proc.pid, user, ", ".join(uuids))
            signalled.append((proc, uuids, live))
        actions.extend(self._reap(signalled))
        return actions

    def enforce_stray(self, snapshot: Snapshot, allowed: Mapping[str, Collection[str]], *,
                      dry_run: bool | None = None) -> list[Action]:
        """Users whose GPU access was revoked (kernels culled): stop their processes, kernels
        included, on any GPU not in ``allowed[user]`` (what they still hold). A process on
        one of their own GPUs is left alone; root, system users and the agent never."""
        stray = [p for p in snapshot.processes
                 if p.user is not None and p.user in allowed and p.gpu_uuid not in allowed[p.user]]
        if not stray:
            return []
        for p in stray:
            log.warning("Stray GPU process pid %d of %s on %s: GPU access revoked, stopping it",
                        p.pid, p.user, p.gpu_uuid)
        users = {p.user for p in stray if p.user}
        return self.enforce(Snapshot(snapshot.taken_at, snapshot.gpus, stray), users, users, dry_run=dry_run)

    def _reap(self, signalled: list[tuple[GpuProcess, tuple[str, ...], psutil.Process]]) -> list[Action]:
        """Wait out the grace for all signalled processes together, then SIGKILL the rest."""
        if not signalled:
            return []
        deadline = time.monotonic() + self.grace
        pending = list(signalled)
        while pending and time.monotonic() < deadline:
            time.sleep(self.poll)
            pending = [s for s in pending if _alive(s[2])]
        out = []
        still = {id(s) for s in pending}
        for entry in signalled:
            proc, uuids, live = entry
            if id(entry) not in still:
                out.append(Action(proc.pid, proc.user or "", proc.uid, uuids, TERMINATED))
                continue
            try:
                live.send_signal(signal.SIGKILL)  # psutil refuses if the pid was reused meanwhile
                log.warning("Sent SIGKILL to pid %d of %s after %.0fs grace", proc.pid, proc.user, self.grace)
                out.append(Action(proc.pid, proc.user or "", proc.uid, uuids, KILLED))
            except psutil.NoSuchProcess:
                out.append(Action(proc.pid, proc.user or "", proc.uid, uuids, TERMINATED))
            except psutil.Error as e:
                out.append(Action(proc.pid, proc.user or "", proc.uid, uuids, FAILED, str(e)))
        return out
