"""The ready spawners for processes on the hub's machine: the mixin on JupyterHub's local spawners."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import time
from collections.abc import Callable
from typing import Any

import psutil
from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from traitlets import Integer, Unicode

from ...agent.servers import RECORD_DIR, forget_server, record_server
from ...spawner.base import GPUPoolSpawner
from ...spawner.ends import NothingRan, ProcessEnd, WorkEnd
from ...spawner.errors import require_unix_account

__all__ = ["GPUPoolLocalProcessSpawner", "GPUPoolSimpleSpawner"]

#: seconds between looks at a stopping server; a look is one waitpid
DEATH_POLL_INTERVAL = 0.1


class _PromptStop:
    """JupyterHub waits for a stopping local server with exponential backoff, up to 5 s between
    looks, so a server that exits in one second is seen gone up to five seconds later: its GPUs
    stay held (and charged) that long, a queued user waits that long, and under load the demo's
    Ctrl-C overran its 10 s. A look at a local child is one waitpid, so look often.

    The GPUs go back only once the server's process is gone (issue 48.2): JupyterHub forgets the
    pid when it stops the server, so the stop names the process by pid and start time."""

    def gpupool_work_end(self) -> WorkEnd:
        pid = self.pid  # type: ignore[attr-defined]
        return ProcessEnd.of(pid) if pid else NothingRan("no process")

    async def wait_for_death(self, timeout: float = 10) -> bool:
        deadline = time.monotonic() + timeout
        while await self.poll() is None:  # type: ignore[attr-defined]
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(DEATH_POLL_INTERVAL, left))
        return True


class GPUPoolLocalProcessSpawner(_PromptStop, GPUPoolSpawner, LocalProcessSpawner):
    """LocalProcessSpawner with GPU profiles: each server runs as its user's own Unix account
    (the hub runs as root), sees only its GPUs (by UUID), and creates files only its user can read."""

    umask = Integer(
        0o077,
        help="""The umask of each single-user server (and so of its kernels and terminals).

        The default 0o077 makes the files a user's code creates readable by that
        user only; with the hub's usual 0o022 every other user of the machine
        could read them in a home directory that others may enter (Debian's
        useradd makes homes 0755 unless HOME_MODE says otherwise). None keeps
        the hub's umask.""",
        allow_none=True,
    ).tag(config=True)

    server_record_dir = Unicode(
        RECORD_DIR,
        help="""Where each server is recorded as it starts (pid, owner, start time), for the node agent of
        this host (c.GPUPoolAgent.server_record_dir, the same default). When the agent stops the GPU
        processes of a user out of tokens, it leaves only the kernels of a recorded server to the hub's
        culling: a process that merely calls itself jupyter-lab is stopped. Empty: record nothing.""",
    ).tag(config=True)

    _open_homes_warned: set[str] = set()  # once per home and hub process, not at every spawn

    async def start(self) -> Any:
        """Start the server, then record its pid: the node agent trusts that record, never a name."""
        result = await super().start()
        if self.server_record_dir and self.pid:
            try:
                record_server(self.server_record_dir, self.pid, self.user.name, self.name or "")
            except (OSError, psutil.Error) as e:
                self.log.warning("Could not record the server of %s (pid %d) in %s for the node agent: %s; its "
                                 "kernels count as the user's own processes if the pool stops them",
                                 self.user.name, self.pid, self.server_record_dir, e)
        return result

    async def stop(self, now: bool = False) -> None:
        """Stop the server, then drop its record (kept if the stop failed: the server may still run)."""
        pid = self.pid  # the stop clears it
        await super().stop(now=now)
        if pid and self.server_record_dir:
            try:
                forget_server(self.server_record_dir, pid)
            except OSError as e:  # a stale record is harmless: the agent checks its pid's start time
                self.log.debug("Could not remove the record of pid %d: %s", pid, e)

    def gpupool_check_user(self) -> None:
        """The server runs as the Unix account of the hub's user name: an ordinary login name
        with an account (unixname.RULE), else 403 before the pool is asked for anything."""
        require_unix_account(self.user.name, self.config)

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        become_user = super().make_preexec_fn(name)
        mask = self.umask
        self._warn_if_home_is_open(name)

        def preexec() -> None:
            if mask is not None:
                os.umask(mask)
            become_user()

        return preexec

    def _warn_if_home_is_open(self, name: str) -> None:
        try:
            home = pwd.getpwnam(name).pw_dir
            mode = os.stat(home).st_mode
        except (KeyError, OSError):
            return
        if mode & (stat.S_IRWXG | stat.S_IRWXO) and home not in self._open_homes_warned:
            self._open_homes_warned.add(home)
            self.log.warning("Home directory %s of %s is open to other users (mode %o); files there that are "
                             "not private (e.g. copied in) are readable by everyone: chmod 700 it, or set "
                             "HOME_MODE 0700 in /etc/login.defs", home, name, stat.S_IMODE(mode))


class GPUPoolSimpleSpawner(_PromptStop, GPUPoolSpawner, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner with GPU profiles. Demo and tests only: every server runs as the
    hub's own Unix user, so any user's code can read the service's token and everyone's files."""
