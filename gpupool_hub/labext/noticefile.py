"""The notice file's writer: the single-user server keeps ``GPUPOOL_NOTICE_FILE`` current.

Why here: the countdown is known to the service, but the file must be on the
file system where the user's code runs, as the user: a service or spawner on
the hub's machine cannot write into a Slurm node's or a systemd server's home.
The single-user server runs in exactly that place, as that user, and already
asks the service for ``GET me`` with its own token (the widget's path,
:mod:`.handlers`); so it polls ``GET me`` here too, every
``GPUPOOL_NOTICE_INTERVAL`` seconds (default 15; a countdown is minutes long),
and writes what :func:`gpupool_hub.notice.pending_notice` finds for this server.
A server that cannot reach the service keeps the file as it is: a deadline the
pool announced stays the best guess. At start-up the first poll replaces or
removes what an earlier run of the server left.

The spawner's value may start with ``~``: the path is expanded here and put back
into the server's environment, so kernels and terminals see an absolute path.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop, PeriodicCallback

from ..notice import ALLOCATION_ENV, NOTICE_FILE_ENV, notice_path, pending_notice, write_notice
from .handlers import BalanceUnavailable, ServiceLocator, env_seconds, fetch_me

#: seconds between two looks at the pool (env), default below
INTERVAL_ENV = "GPUPOOL_NOTICE_INTERVAL"
DEFAULT_INTERVAL = 15.0

log = logging.getLogger(__name__)


def poll_interval() -> float:
    """The configured interval; a value that is not a positive number gives the default."""
    return env_seconds(INTERVAL_ENV, DEFAULT_INTERVAL)


class NoticeFileWriter:
    """Polls the pool and keeps one server's notice file current."""

    def __init__(self, path: Path, allocation: str, server: str, logger: Any = log) -> None:
        self.path = path
        self.allocation = allocation
        self.server = server
        self.log = logger
        self.locator = ServiceLocator()
        self._callback: PeriodicCallback | None = None
        self._busy = False
        self._failed = ""

    async def update(self) -> bool:
        """One look at the pool; True when the file changed. A pool that does not answer changes nothing."""
        if self._busy:  # the last look has not come back yet (timeouts are longer than short intervals)
            return False
        self._busy = True
        try:
            me = await fetch_me(self.locator)
        except BalanceUnavailable as e:
            self.log.debug("gpupool notice file kept: %s", e.reason)
            return False
        finally:
            self._busy = False
        notice = pending_notice(me, self.allocation, self.server)
        try:
            changed = write_notice(self.path, notice)
        except OSError as e:
            if str(e) != self._failed:  # once per cause, not every few seconds
                self.log.warning("gpupool: cannot write the notice file %s: %s", self.path, e)
            self._failed = str(e)
            return False
        self._failed = ""
        if changed:
            if notice:
                self.log.warning("gpupool: this server's GPUs are taken at %s (%s); written to %s",
                                 notice["deadline"], notice["kind"], self.path)
            else:
                self.log.info("gpupool: no stop pending any more; %s removed", self.path)
        return changed

    def start(self, interval: float) -> None:
        self._callback = PeriodicCallback(self.update, interval * 1000)
        self._callback.start()
        IOLoop.current().add_callback(self.update)  # at once: an earlier run's file must not stand

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()


def start_notice_file(serverapp: Any) -> NoticeFileWriter | None:
    """Start the writer when the spawner named a notice file for a server with GPUs (a
    server without GPUs loses nothing when the pool takes GPUs back); None otherwise."""
    path = notice_path()
    allocation = os.environ.get(ALLOCATION_ENV, "")
    if path is None:
        return None
    path = path.absolute()
    os.environ[NOTICE_FILE_ENV] = str(path)  # kernels and terminals inherit the absolute path
    if not allocation:
        return None
    writer = NoticeFileWriter(path, allocation, os.environ.get("JUPYTERHUB_SERVER_NAME", ""), serverapp.log)
    writer.start(poll_interval())
    return writer
