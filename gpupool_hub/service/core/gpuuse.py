"""What the users' GPUs did, per local day: the ledger's ``gpupool_gpu_use`` record.

The ``gpu-use`` job (``jobs/gpuuse.py``) measures each closed interval and
writes it here; the usage pages read it through ``Records``. Each interval is
written once: its rows and its "done" mark go in one transaction, so a rerun
adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ...ledger import GpuUse, Ledger
from .threads import CoreThreads, reads, writes

#: the job name the intervals are marked done under
JOB = "gpu-use"


class GpuUseLog:
    """The gpu-use job's writes and its "done already?" read."""

    def __init__(self, ledger: Ledger, *, threads: CoreThreads | None = None) -> None:
        self.ledger = ledger
        self.threads = threads

    @reads
    def recorded(self, start: datetime) -> bool:
        return self.ledger.intervals.done(JOB, start)

    @writes
    def record(self, rows: Sequence[GpuUse], start: datetime, end: datetime) -> bool:
        """The interval's rows and its mark; False when it was recorded already."""
        return self.ledger.gpu_use.record(list(rows), (JOB, start, end))
