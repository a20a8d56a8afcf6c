"""Whether a stopped server's work really ended: what the release of its GPUs waits for (issue 48.2).

JupyterHub counts a server stopped once ``Spawner.stop`` returns or fails, and then clears the
spawner's state (a batch job's id, a process's pid). A release sent at that moment freed the
GPUs of work that was still running: with slurmctld down, ``scancel`` failed, the job ran on for
14 minutes uncharged, and the pool gave its GPU to the next user. So each stop builds, before
the state is cleared, a :class:`WorkEnd` that names the server's work (the job, the process, the
unit or pod) and can tell whether it has ended and ask the engine again to end it; the release
is sent only once it says ended (``release.Release.end``). The engines' own: :class:`PolledEnd`
for spawners whose poll finds the server by names that outlive the cleared state (systemd's
unit, Kubernetes' pod), :class:`ProcessEnd` for a local process, ``slurm.ends.JobEnd`` for a
Slurm job.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

__all__ = ["NothingRan", "PolledEnd", "ProcessEnd", "WorkEnd"]


class WorkEnd(Protocol):
    """A stopped server's work, as its engine sees it."""

    #: what it is, for the logs and the user ("Slurm job 42", "process 1234")
    what: str

    async def ended(self) -> bool:
        """True only when the engine confirms the work ended; False while it runs or cannot be asked."""

    async def stop_again(self) -> None:
        """Ask the engine once more to end it (a failure is the next check's to see)."""


@dataclass
class NothingRan:
    """A stop of a server whose work never started (no process, no job): nothing to wait for."""

    what: str

    async def ended(self) -> bool:
        return True

    async def stop_again(self) -> None:
        """Nothing to stop."""


@dataclass
class PolledEnd:
    """The wrapped spawner's own ``poll`` (None while the server runs) and ``stop``."""

    what: str
    poll: Callable[[], Awaitable[int | None]]
    stop: Callable[[], Awaitable[None]]

    async def ended(self) -> bool:
        return await self.poll() is not None

    async def stop_again(self) -> None:
        await self.stop()


@dataclass
class ProcessEnd:
    """A server process on the hub's machine, by pid and start time (a pid reused by another
    process after the server's end counts as ended)."""

    pid: int
    started: float | None

    @property
    def what(self) -> str:
        return f"process {self.pid}"

    def _process(self) -> psutil.Process | None:
        if self.pid <= 0:
            return None
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE or (
                    self.started is not None and abs(proc.create_time() - self.started) > 1):
                return None
            return proc
        except psutil.Error:
            return None

    async def ended(self) -> bool:
        return self._process() is None

    async def stop_again(self) -> None:
        if self._process() is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    @classmethod
    def of(cls, pid: int) -> "ProcessEnd":
        """The process ``pid`` as it is now (its start time tells it from a later one of the same pid)."""
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return cls(pid, None)
