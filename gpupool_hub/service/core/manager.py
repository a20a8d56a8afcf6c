"""The service core: money and GPUs, one authority, no HTTP.

``PoolManager`` only builds the units and hands them to each other; each unit
owns its state and is the only one to change it:

========== ================================================================
records    the ledger's reads for the event loop (reader threads)
inventory  the placement pool, prices, node agents' reports
rebinds    bookings moved to the GPUs a batch scheduler bound (swaps)
accounts   opening accounts, credits, grants
admission  affordability, placement, allocation records, release
reclaims   team fair share: holdings, reclaims of borrowed GPUs
queue      servers waiting for GPUs: fair order, reservations, estimates
idle       idle reclaim warnings (the idle job decides)
debits     charging closed intervals; the accounting status
views      the ``me`` view (cached) and allocation JSON
enforcement cull warnings, revoked servers, the node agents' list
memory     the node agents' memory warnings of GPU shares
notices    what users are told after GPUs were taken back (from the audit log)
========== ================================================================

The units are plain synchronous code. Each method that the event loop calls
says at its definition where it runs (``@writes``: the one writer thread, for
anything that may write or change the pool and caches; ``@reads``: a reader
thread, for database reads), and the loop awaits ``unit.method.off_loop(...)``
(:mod:`.threads`). In-process tests call the units directly.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...config import GPUPool
from ...inventory.sources import InventorySource
from ...ledger import AuditEvent, Ledger, utcnow
from ...placement.state import Pool
from ...reasons import AuditAction
from ...usage import UsageSource
from .accounts import Accounts
from .agent_leases import AgentLeases
from .admission import Admission
from .debits import Debits
from .gpuuse import GpuUseLog
from .enforcement import TAKEN_WATCH, Enforcement
from ...takeback.cull import CullWarning
from .idle import IdleWarnings
from .pool_inventory import PoolInventory
from .rebinds import Rebinds
from .memory import MemoryWarnings
from .takeback_notices import Notices
from .queue import WaitQueue
from .reclaims import Reclaims
from .ledger_reads import Records
from .threads import CoreThreads
from .views import ViewCache, Views


class PoolManager:
    """The units of the service core, wired together once."""

    def __init__(self, settings: GPUPool, ledger: Ledger, pool: Pool, usage_source: UsageSource, *,
                 debit_interval: int = 3600, debit_delay_tolerance: int = 900,
                 clock: Callable[[], datetime] = utcnow, threads: CoreThreads | None = None,
                 source: InventorySource | None = None) -> None:
        self.settings = settings
        self.ledger = ledger
        self.clock = clock
        self.threads = threads or CoreThreads(ledger.db.busy_timeout, concurrent_reads=ledger.db.concurrent_reads)
        threads = self.threads
        self.cache = ViewCache()
        self.records = Records(ledger, threads=threads)
        self.gpu_use = GpuUseLog(ledger, threads=threads)
        self.notices = Notices(ledger, self.cache, clock, threads=threads)
        self.inventory = PoolInventory(pool, settings.price_table(), clock, source, threads=threads)
        self.rebinds = Rebinds(self.inventory, threads=threads)
        self.enforcement = Enforcement(clock=clock)
        self.agent_leases = AgentLeases(settings.agent_timeout, clock)
        self.memory = MemoryWarnings()
        self.accounts = Accounts(settings, ledger, self.cache, clock, threads=threads)
        self.reclaims = Reclaims(settings, ledger, self.inventory, self.cache, clock, witnesses=self, threads=threads)
        self.idle = IdleWarnings()
        self.queue = WaitQueue(settings, ledger, self.inventory, self.reclaims, clock,
                               known_ends=self.idle, threads=threads)
        self.admission = Admission(settings, ledger, self.inventory, self.accounts, self.reclaims,
                                   self.enforcement, self.cache, clock, queue=self.queue, threads=threads)
        self.debits = Debits(ledger, self.inventory.prices, usage_source, interval=debit_interval,
                             delay_tolerance=debit_delay_tolerance, clock=clock,
                             charged=self.cache, threads=threads)
        self.views = Views(settings, ledger, self.inventory, self.debits, self.accounts, self.cache, self, clock,
                           self.threads)

    @property
    def pool(self) -> Pool:
        return self.inventory.pool

    def warning_for(self, user: str) -> CullWarning | None:
        """What the user is warned of: a cull of their kernels, or a preemption of a server."""
        return self.enforcement.warnings.get(user) or self.reclaims.warnings.get(user) or self.idle.for_user(user)

    # the views' UserParts and the reclaims' PreemptWitnesses: the manager asks the units that know

    def memory_warnings(self, user: str) -> list[dict[str, Any]]:
        return self.memory.for_user(user)

    def user_notices(self, user: str) -> list[dict[str, Any]]:
        return self.notices.for_user(user)

    def record(self, event: AuditEvent) -> Any:
        return self.notices.record(event)

    def gpus_taken(self, user: str, server: str, at: datetime) -> None:
        self.enforcement.gpus_taken(user, server, at)

    def activity(self, user: str, allocations: list[dict[str, Any]]) -> dict[str, Any]:
        """The parts of ``GET me`` that change without the account changing: the user's
        GPUs as measured with their idleness, and the servers waiting for GPUs."""
        return {"gpu_servers": self.idle.activity(user, allocations), "waiting": self.queue.reports.waiting_of(user)}

    def restore(self) -> int:
        """At start-up: rebuild the placement pool from the allocations the ledger says are
        held, and the node agents' enforcement list from the audit log. Returns how many
        allocations were restored."""
        restored = self.inventory.restore(self.ledger)
        self.queue.restore()
        events = self.ledger.audit.latest_per_server([AuditAction.CULL_KERNELS.value, AuditAction.STOP_SERVER.value])
        # no account, no balance below zero: nothing to enforce (left out of balances)
        self.enforcement.restore(events, self.ledger.balances({e.user for e in events}))
        self.enforcement.restore_taken(self.ledger.audit.of_actions(
            [AuditAction.PREEMPT.value, AuditAction.IDLE_RECLAIM.value], since=self.clock() - TAKEN_WATCH))
        # fair share: cool-downs and counters from the preempt events; held servers re-classified
        self.reclaims.restore(self.ledger.audit.of_actions([AuditAction.PREEMPT.value]),
                              self.ledger.allocations.active())
        # the epoch and the last debit are read by every GET me: read them now, not on the event loop
        self.ledger.epoch(self.clock())
        self.debits.last_debit()
        return restored

    def close(self) -> None:
        self.threads.close()
