"""Who is being culled or enforced against, as the cull job decided it.

The cull job (``jobs/cull.py``) writes here through these methods; the ``me``
view reads the warnings and the node agents read the enforcement list. Kept in
memory; at start-up the service rebuilds the enforcement list from the audit
log (``restore``), since the cull job only revisits users it has a reason to
look at (GPUs held, a warning, already on the list): without it, a user culled
before a restart would be off the list for good, and their stray GPU
processes would run on.

Admission (on the writer thread) notes refusals for lack of capacity here, per
user; the cull job asks for the newest refusal *of others* when it judges a
user, so a user's own refused spawn never puts that user under pressure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ...ledger import AuditEvent, utcnow
from ...reasons import AuditAction
from ...takeback.cull import CullWarning, last_refusal_of_others


#: how long after the service took a server's GPUs (reclaim, idle reclaim) its user's processes
#: on GPUs they no longer hold count as stray for the node agents
TAKEN_WATCH = timedelta(hours=1)


@dataclass
class Enforcement:
    """Cull warnings, servers whose GPUs were revoked, and the node agents' list."""

    warnings: dict[str, CullWarning] = field(default_factory=dict)
    # a dry run keeps its warnings apart, so users never see them
    dry_warnings: dict[str, CullWarning] = field(default_factory=dict)
    # (user, server) whose kernels were culled while the server kept running
    revoked: dict[tuple[str, str], datetime] = field(default_factory=dict)
    # users whose GPU processes the node agents stop; of those, whose kernels too
    users: set[str] = field(default_factory=set)
    kernel_users: set[str] = field(default_factory=set)
    # per user, their newest spawn refused for lack of capacity: a pressure signal for culling
    refusals: dict[str, datetime] = field(default_factory=dict)
    # (user, server) whose GPUs the service took back while the user kept their balance
    # (reclaimed, idle): for TAKEN_WATCH their processes on GPUs they no longer hold are stray
    taken: dict[tuple[str, str], datetime] = field(default_factory=dict)
    clock: Callable[[], datetime] = utcnow
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_capacity_refusal(self, user: str, at: datetime) -> None:
        """Called by admission (writer thread) when ``user``'s spawn found no room."""
        with self._lock:
            self.refusals[user] = at

    def last_refusal_excluding(self, user: str) -> datetime | None:
        """The newest capacity refusal of anyone but ``user`` (the cull job, event loop)."""
        with self._lock:
            refusals = dict(self.refusals)
        return last_refusal_of_others(refusals, user)

    def restore(self, events: Iterable[AuditEvent], balances: Mapping[str, Decimal]) -> None:
        """Rebuild the node agents' list after a restart from the newest non-dry-run
        ``cull_kernels``/``stop_server`` per (user, server) (``ledger.audit.latest_per_server``):
        users still below zero go back on the list, and servers whose kernels were
        culled (not stopped since) are revoked again. A user topped up since is left
        off, as ``reinstate`` would have done."""
        for e in events:
            if e.dry_run or balances.get(e.user, Decimal(0)) >= 0:
                continue
            self.users.add(e.user)
            if e.action == AuditAction.CULL_KERNELS.value:
                self.revoked[(e.user, e.server)] = e.at

    def warnings_for(self, dry_run: bool) -> dict[str, CullWarning]:
        """The cull warnings standing now (a dry run's apart), for the rules to read."""
        return self.dry_warnings if dry_run else self.warnings

    def warn(self, user: str, warning: CullWarning, *, dry_run: bool) -> None:
        """The cull job warned ``user``: their kernels stop at ``warning.deadline``."""
        self.warnings_for(dry_run)[user] = warning

    def clear(self, user: str, *, dry_run: bool) -> None:
        """``user``'s cull warning no longer stands (topped up, pressure gone)."""
        self.warnings_for(dry_run).pop(user, None)

    def restore_taken(self, events: Iterable[AuditEvent]) -> None:
        """After a restart: servers whose GPUs were reclaimed within ``TAKEN_WATCH``."""
        for e in events:
            self.gpus_taken(e.user, e.server, e.at)

    def kernels_culled(self, user: str, server: str, at: datetime) -> None:
        self.revoked[(user, server)] = at
        self.users.add(user)
        warning = self.warnings.get(user)
        if warning is not None and warning.done_at is None:
            self.warnings[user] = replace(warning, done_at=at)

    def gpus_taken(self, user: str, server: str, at: datetime) -> None:
        """The service released a server's GPUs without a cull (reclaim, idle reclaim): a process
        of the user that survived the stop, or a server the hub failed to stop, must not keep
        using GPUs that now belong to someone else."""
        if self.clock() - at < TAKEN_WATCH:
            with self._lock:  # the writer thread (reclaims) and the event loop (idle job, agents) both come here
                self.taken[(user, server)] = max(at, self.taken.get((user, server), at))

    def server_stopped(self, user: str, server: str) -> None:
        self.revoked.pop((user, server), None)
        self.users.add(user)

    def reinstate(self, user: str) -> None:
        """The user's balance is back above zero: the agents leave their processes alone."""
        self.users.discard(user)
        for key in [k for k in self.revoked if k[0] == user]:
            del self.revoked[key]

    def revoked_servers(self) -> list[tuple[str, str]]:
        return list(self.revoked)

    def stray_users(self) -> set[str]:
        """Users whose kernels were culled while their server runs, or whose server's GPUs
        were taken back within ``TAKEN_WATCH``: their GPU access was revoked, so any process
        of theirs on a GPU they no longer hold is stray."""
        since = self.clock() - TAKEN_WATCH
        with self._lock:
            for key in [k for k, at in self.taken.items() if at < since]:
                del self.taken[key]
            taken = {user for user, _server in self.taken}
        return {user for user, _server in self.revoked} | taken

    def agent_list(self, held: Mapping[str, Iterable[str]] | None = None) -> dict[str, Any]:
        """What node agents enforce: users whose GPU processes stop, whose kernels too, and
        (``allowed``) per revoked user the GPU UUIDs they still hold (``held``): their
        processes on other GPUs, kernels included, are stopped."""
        held = held or {}
        return {"users": sorted(self.users), "kernels": sorted(self.kernel_users & self.users),
                "allowed": {u: sorted(held.get(u, ())) for u in sorted(self.stray_users())}}
