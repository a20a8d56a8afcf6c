"""The embedded usage source: charge from the service's own allocation records.

Needs no Prometheus, so a small install works out of the box. What it charges
is what was *allocated* (a server holding two GPUs pays for two, busy or not),
exactly to the microsecond of the allocation's start and release; an allocation
whose server's work had not started yet (a batch job pending in Slurm) is charged
from when it did (``AllocationRecord.charged_from``). A MIG
instance is charged as an instance of its profile (see ``Usage.mig_profile``),
a fraction by its guarantee class (``Usage.share_class``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from ..ledger import Ledger
from .base import Usage


class AllocationRecordsSource:
    name = "records"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def usage(self, start: datetime, end: datetime) -> list[Usage]:
        totals: dict[tuple[str, str, str, str], Decimal] = defaultdict(Decimal)
        for record in self.ledger.allocations.overlapping(start, end):
            span = record.charged_span(start, end)  # from when its work started: a pending job is not
            if span is None:
                continue
            delta = span[1] - span[0]
            seconds = Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 1_000_000
            for gpu in record.gpus:
                profile = gpu.get("mig_profile")
                if profile:
                    totals[(record.user, gpu["model"], profile, "")] += seconds
                else:
                    share = (gpu.get("share") or "timeslice") if int(gpu["milli"]) < 1000 else ""
                    totals[(record.user, gpu["model"], "", share)] += seconds * Decimal(gpu["milli"]) / 1000
        return [Usage(user, model, secs, profile or None, share)
                for (user, model, profile, share), secs in sorted(totals.items())]
