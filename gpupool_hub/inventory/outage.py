"""A controller's outage said once: an inventory refresh or a spawner's poll every few seconds would
otherwise log an ERROR with a traceback each time the scheduler is down."""

from __future__ import annotations

import logging
import time

__all__ = ["OutageLog"]


class OutageLog:
    """Say once that a controller (slurmctld) stopped answering, and once that it answers again.

    A refresh every few seconds, or a poll per server, would otherwise log an ERROR with a
    traceback each time slurmctld is down: one WARNING per outage, with the command's
    error, then one INFO with how long it lasted.
    """

    def __init__(self, log: logging.Logger, what: str = "slurmctld") -> None:
        self.log = log
        self.what = what
        self.since: float | None = None
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, error: str) -> None:
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s does not answer: %s (said once until it answers again)", self.what, error)
        else:
            self.log.debug("%s still does not answer: %s", self.what, error)

    def ok(self) -> None:
        if self.since is not None:
            self.log.info("%s answers again, after %.0f s and %d failed command(s)", self.what,
                          time.monotonic() - self.since, self.failures)
        self.since = None
        self.failures = 0
