"""Which service runs the periodic jobs when several share one ledger.

Two gpupool services on one database (a crashed hub's orphan next to its
successor, or a second hub by mistake) would both debit, cull and dispatch.
The ledger keeps one lease row; only its holder runs the jobs that change
money or servers. A holder renews it every ``ttl / 3`` seconds; a successor
takes it when it expired, or at once when the holder was a process of this
host that no longer exists (a ``kill -9`` of the old service).
"""

from __future__ import annotations

import logging
import os
import socket

import psutil

from ...ledger import Ledger
from .threads import CoreThreads, writes

log = logging.getLogger("gpupool.lease")

#: The lease the periodic jobs run under.
JOBS = "jobs"


def this_process() -> str:
    """``host:pid:start`` — the start time tells a reused PID from the holder."""
    started = int(psutil.Process().create_time() * 100)
    return f"{socket.gethostname()}:{os.getpid()}:{started}"


def holder_gone(holder: str) -> bool:
    """True when ``holder`` was a process of this host that has ended.
    A holder on another host is only ever freed by its lease expiring."""
    host, _, rest = holder.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or not started.isdigit():
        return False
    try:
        return int(psutil.Process(int(pid)).create_time() * 100) != int(started)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # cannot tell (permissions): let the lease expire instead
        return False


class JobsLease:
    """This service's claim on the periodic jobs; ``held`` is what the job runner reads."""

    def __init__(self, ledger: Ledger, ttl: float = 30.0, holder: str | None = None, *,
                 threads: CoreThreads | None = None) -> None:
        self.ledger = ledger
        self.threads = threads
        self.ttl = ttl
        self.holder = holder or this_process()
        self.held = False
        self.current: str | None = None

    @writes
    def renew(self) -> bool:
        """Take or renew the lease (a database write: call it on the writer thread).
        A failed renewal counts as not held: two runners are worse than a skipped run."""
        try:
            current = self.ledger.leases.claim(JOBS, self.holder, self.ttl, holder_gone=holder_gone)
        except Exception as e:
            if self.held:
                log.warning("gpupool: cannot renew the jobs lease (%s); periodic jobs pause until it is renewed", e)
            self.held = False
            self.current = None
            return False
        if current != self.current:
            if current == self.holder:
                log.warning("gpupool: this service (%s) now runs the periodic jobs", self.holder)
            else:
                log.warning("gpupool: the periodic jobs run in another service (%s); this one (%s) waits "
                            "and takes over if that one stops", current, self.holder)
        self.current = current
        self.held = current == self.holder
        return self.held

    @writes
    def release(self) -> None:
        """At a clean stop, so that a successor takes over at once."""
        if self.held:
            self.held = False
            self.ledger.leases.release(JOBS, self.holder)
            log.info("gpupool: jobs lease released")
