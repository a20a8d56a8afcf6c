"""Which Slurm jobs the ``slurm`` usage preset charges, and to which hub user.

:class:`~gpupool_hub.engines.slurm.accounting.SlurmUsageSource` reads GPU-seconds per job
from ``sacct``; this module decides whose tokens pay for each job:

* **A server the hub started** carries ``--comment=gpupool-allocation=<id>``
  (the ``gpupool-slurm`` spawner sets it). It is charged to the user who owns
  that allocation in the ledger, whatever Unix user the job ran as (with
  ``exec_prefix = ""`` every server runs as the hub's own user). The comment
  is accepted only from a job that ran as that hub user or as the service's
  own Unix user, so nobody can put a job on someone else's bill by copying
  an allocation id into their own ``--comment``.
* **Any other GPU job** (plain ``sbatch``/``srun``) is charged only with
  ``charge_batch_jobs``, to its Slurm user, and only when that name has an
  account in the ledger (a hub user): jobs of people who are not hub users
  are nobody's to pay.

Everything is looked up in the ledger at charge time, so a restart (or a
re-run of an interval) gives the same answer; for an interval's jobs together
(:meth:`HubJobOwners.for_jobs`) in a few bulk reads, as one read per job
made the hourly charge of 5,000 jobs take 9 s on PostgreSQL.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Callable, Sequence

from ...ledger import Ledger, UnknownAccount
from .accounting import JobOwners, SacctJob
from .parse import ALLOCATION_COMMENT, allocation_of

__all__ = ["ALLOCATION_COMMENT", "HubJobOwners", "allocation_of"]

log = logging.getLogger(__name__)

def _own_unix_user() -> str | None:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


class HubJobOwners(JobOwners):
    """``user_of`` for :class:`~gpupool_hub.engines.slurm.accounting.SlurmUsageSource`: job -> hub user, or None.

    ``server_users`` are the Unix users the hub's servers may run as besides
    their hub user (default: the service's own, which is the hub's).
    """

    def __init__(self, ledger: Ledger, *, charge_batch_jobs: bool = False,
                 server_users: frozenset[str] | None = None) -> None:
        self.ledger = ledger
        self.charge_batch_jobs = charge_batch_jobs
        own = _own_unix_user()
        self.server_users = server_users if server_users is not None else frozenset({own} if own else ())
        self._warned: set[str] = set()

    def __call__(self, job: SacctJob) -> str | None:
        return self._owner(job, self._allocation_user, self._is_hub_user)

    def for_jobs(self, jobs: Sequence[SacctJob]) -> Callable[[SacctJob], str | None]:
        """The owners of ``jobs`` read together: one query per 500 allocation ids, and with
        ``charge_batch_jobs`` one per 500 Slurm user names; the answers and warnings per job
        are those of ``__call__``, in the order the jobs are asked about."""
        ids = {alloc_id for alloc_id in (allocation_of(j.comment) for j in jobs) if alloc_id is not None}
        owners = self.ledger.allocations.owners(ids) if ids else {}
        names = {j.user for j in jobs} if self.charge_batch_jobs else set()
        hub_users = set(self.ledger.balances(names)) if names else set()  # the names with an account
        return lambda job: self._owner(job, owners.get, hub_users.__contains__)

    def _owner(self, job: SacctJob, allocation_user: Callable[[str], str | None],
               is_hub_user: Callable[[str], bool]) -> str | None:
        alloc_id = allocation_of(job.comment)
        if alloc_id is not None:
            user = allocation_user(alloc_id)
            if user is not None and (job.user == user or job.user in self.server_users):
                return user
            self._warn(job, "no allocation of that id" if user is None else
                       f"it ran as {job.user!r}, not as {user!r} or the hub's Unix user")
        if self.charge_batch_jobs and is_hub_user(job.user):
            return job.user
        return None

    def _allocation_user(self, alloc_id: str) -> str | None:
        record = self.ledger.allocations.get(alloc_id)
        return None if record is None else record.user

    def _is_hub_user(self, name: str) -> bool:
        try:
            self.ledger.account(name)
        except UnknownAccount:
            return False
        return True

    def _warn(self, job: SacctJob, why: str) -> None:
        if job.job_id not in self._warned:  # once per job, not once per interval it spans
            self._warned.add(job.job_id)
            log.warning("Slurm job %s has comment %r but is not charged as a hub server: %s",
                        job.display_id, job.comment[:200], why)
