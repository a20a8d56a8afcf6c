"""The batch half of the Slurm spawner's start: submit, wait for the job to run, then for its
server to report its port, watching the job the whole time.

batchspawner's own start stops looking at the job once it runs and then waits for the port
in a loop that only sleeps. A job that died in its first second (a Python its user may not
run, a command not on the job's PATH) left the hub waiting for the whole ``start_timeout``
and told the user "timeout", not why. Here the job is asked every ``startup_poll_interval``
until the server is ready; once it has ended the spawn fails at once with the job's state,
exit code and the last lines of its output file (:func:`output_tail`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import pwd
import stat
from typing import Any

from batchspawner import JobStatus, SlurmSpawner
from traitlets import Integer

from ...spawner.errors import GPUPoolRefused, SpawnFailure
from .commands import SlurmError
from .inventory import SlurmInventory
from .parse import SlurmJob

__all__ = ["SlurmJobStart", "output_tail"]

#: bytes read from the end of a failed job's output file
TAIL_BYTES = 16384


def output_tail(path: str, owner: str, lines: int) -> tuple[str | None, str | None]:
    """The last ``lines`` lines of a job's output file: ``(text, None)``, or ``(None, why not)``.

    The hub usually runs as root and the path is in the user's home: the file is opened
    without following a symbolic link and must be a regular file owned by ``owner``, so a
    user cannot have the hub show them another account's file (a link to /etc/shadow).
    """
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        uid = None  # no account on the hub's machine: only the hub's own files could match
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "it is a symbolic link"
        return None, e.strerror or str(e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "it is not a regular file"
        if st.st_uid != uid:
            return None, f"it does not belong to {owner}"
        os.lseek(fd, max(st.st_size - TAIL_BYTES, 0), os.SEEK_SET)
        data = os.read(fd, TAIL_BYTES)
    finally:
        os.close(fd)
    text = data.decode(errors="replace").replace("\r", "")
    kept = [ln for ln in text.split("\n") if ln.strip()][-lines:]
    clean = ["".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in ln) for ln in kept]
    return ("\n".join(clean) or None), (None if clean else "it is empty")


def resolve_output_path(pattern: str, job: SlurmJob) -> str:
    """slurmctld prints ``StdOut`` with the job's own filename patterns expanded in most
    versions; expand the usual ones (``%j``, ``%u``, ``%x``, ``%%``) where it did not."""
    out, i = [], 0
    values = {"j": str(job.job_id), "u": job.user, "x": job.name, "%": "%"}
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class SlurmJobStart(SlurmSpawner):
    """batchspawner's SlurmSpawner whose start fails as soon as the job ends before its server is up."""

    job_output_lines = Integer(
        12, help="Lines of a failed job's output file shown in the spawn's error message.",
    ).tag(config=True)

    def slurm_inventory(self) -> SlurmInventory:  # pragma: no cover - GPUPoolSlurmSpawner provides it
        raise NotImplementedError("Subclass must provide implementation")

    async def start(self) -> Any:
        """Submit, then wait for RUNNING and for the server's port; the job ending first fails the spawn."""
        self.ip = self.traits()["ip"].default_value
        self.port = self.traits()["port"].default_value
        if self.server:
            self.server.port = self.port
        await self.submit_batch_script()
        if not self.job_id:
            raise RuntimeError("sbatch printed no job id; see the hub's log for its output")
        while True:
            status = await self.query_job_status()
            if status == JobStatus.RUNNING:
                break
            if status == JobStatus.NOTFOUND:
                raise await self.job_ended_error()
            await asyncio.sleep(self.startup_poll_interval)
        self.ip = self.state_gethost()
        while self.port == 0:
            await asyncio.sleep(self.startup_poll_interval)
            if self.port == 0 and await self.query_job_status() == JobStatus.NOTFOUND:
                raise await self.job_ended_error()
        # batchspawner-singleuser reports the port *before* it runs the server command, so a
        # command that fails would leave the hub in its http_timeout: wait until it listens
        while not await self._server_listens():
            if await self.query_job_status() == JobStatus.NOTFOUND:
                raise await self.job_ended_error()
            await asyncio.sleep(self.startup_poll_interval)
        self.db.commit()
        self.log.info("Server job %s of %s is up at %s:%s", self.job_id, self._log_name, self.ip, self.port)
        return self.ip, self.port

    async def _server_listens(self) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.ip, self.port), timeout=2)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        return True

    async def job_ended_error(self) -> GPUPoolRefused:
        """Why the job ended, for the user and the admin: state, exit code, its output's last lines."""
        job_id = self.job_id
        try:
            job = await asyncio.get_running_loop().run_in_executor(None, self.slurm_inventory().job, int(job_id))
        except (SlurmError, ValueError) as e:
            self.log.warning("Could not read the state of ended job %s: %s", job_id, e)
            job = None
        if job is None:
            message = (f"Slurm job {job_id} ended before its server was ready, and slurmctld no longer knows "
                       f"it ({self.job_status or 'not in squeue'}).")
        else:
            exit_code = f", exit code {job.exit_code}" if job.exit_code else ""
            why = f", reason {job.reason}" if job.reason else ""
            message = f"Slurm job {job_id} ended ({job.state}{exit_code}{why}) before its server was ready."
            if job.stdout:
                path = resolve_output_path(job.stdout, job)
                tail, not_read = output_tail(path, job.user or self.user.name, self.job_output_lines)
                if tail:
                    message += f" Last lines of {path}:\n{tail}"
                else:
                    where = f" on {','.join(job.nodes)}" if job.nodes else ""
                    message += f" Its output is in {path}{where} (the hub cannot show it: {not_read})."
        self.log.warning("Spawn of %s failed: %s", self._log_name, message)
        return GPUPoolRefused(message, reason=SpawnFailure.JOB_ENDED, status_code=500)
