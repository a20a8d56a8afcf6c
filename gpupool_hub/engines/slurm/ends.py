"""When a stopped server's Slurm job has really ended, for the release of its GPUs (issue 48.2).

``spawner/ends.py`` says why a release waits for the engine. For Slurm that is the job leaving
``squeue`` or reaching an end state there: ``COMPLETING`` still runs its processes (and epilog),
and a ``squeue`` that cannot reach slurmctld says nothing, so neither counts as ended. The
spawner builds a :class:`JobEnd` at the stop, with the job id and its own query and cancel
commands (its ``batch_query_cmd`` and ``batch_cancel_cmd``, run as the user) bound to it, before
JupyterHub clears the spawner's state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["END_STATES", "JobEnd", "job_ended"]

#: squeue's states of a job that has ended (``squeue -j`` lists them until slurmctld forgets it)
END_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                        "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT"})


def job_ended(squeue_line: str | None, error: str | None) -> bool:
    """Whether ``squeue -h -j <id> -o '%T …'`` says the job ended: an end state, no line at all, or
    slurmctld no longer knowing the id. Any other failure (slurmctld down) says nothing: not ended."""
    if error is not None:
        return "Invalid job id" in error
    words = (squeue_line or "").split()
    return not words or words[0] in END_STATES


@dataclass
class JobEnd:
    """A stopped server's Slurm job: ``query`` runs its squeue line (RuntimeError with squeue's
    message on failure), ``cancel`` its scancel."""

    job_id: int
    query: Callable[[], Awaitable[str]]
    cancel: Callable[[], Awaitable[str]]

    @property
    def what(self) -> str:
        return f"Slurm job {self.job_id}"

    async def ended(self) -> bool:
        try:
            return job_ended(await self.query(), None)
        except RuntimeError as e:
            return job_ended(None, str(e))

    async def stop_again(self) -> None:
        await self.cancel()
