"""GPUPoolSlurmSpawner: batchspawner's SlurmSpawner with the pool choosing node, model and count.

The pool decides before anything is submitted (``gpupool_prepare``); the job
then asks Slurm for exactly that: ``--nodelist=<node> --gres=gpu:<type>:<n>``
(a share of one GPU: ``--gres=shard:<type>:<n>``, n of the GPU's shards) plus the profile's CPUs and memory, all through batchspawner's ``req_*``
traits (template variables of ``batch_script``), set as allocation overrides.
Only those traits reach the script: raw user options never do.

Once the job runs, the GPU indices Slurm really bound (``scontrol -d show
job``: ``GRES=gpu:a6000:2(IDX:1-2)``) are recorded in the allocation
(``PATCH allocations/{id}``), so the pool map shows the true devices; a share
moves to the GPU whose shards Slurm gave (``GRES=shard:a6000:8(IDX:1)``). Stop is
``scancel`` (batchspawner); a job gone from the queue makes ``poll`` report the
server gone, and the mixin gives the GPUs back.

Commands run without a shell, with ``c.GPUPool.slurm_conf`` as ``SLURM_CONF``.
Each command template (``exec_prefix``, ``batch_submit_cmd``, ...) is split
into words with ``shlex`` *before* the values go in (:func:`command_argv`):
a value stays one argument, so it cannot add options to ``sudo`` nor break the
quoting (batchspawner joins the filled-in templates into one shell string).
One argument is not enough: ``sudo -u '#0'`` and ``runuser -u '#0'`` read the
name as uid 0. So a spawn goes ahead only for a user name that is a Unix login
name with an account on the hub's machine (``gpupool_hub.identity.unix``, checked
before the pool is asked), and :func:`command_argv` refuses any value starting
with ``#`` or ``-``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import shlex
import shutil
from datetime import datetime, timezone
from decimal import Decimal
from urllib.parse import quote
from collections.abc import Mapping
from typing import Any

from batchspawner import JobStatus
from batchspawner.batchspawner import format_template
from traitlets import Dict, Unicode, default

from ...spawner.base import GPUPoolSpawner
from ...spawner.ends import NothingRan, WorkEnd
from ...spawner.client import ServiceUnavailable
from ...spawner.errors import GPUPoolRefused, SpawnFailure, require_unix_account
from ...identity.unix import RULE, starts_unsafely
from ...inventory.outage import OutageLog
from .commands import SlurmCommandError, SlurmError, controller_unreachable, run_slurm
from .ends import JobEnd, job_ended
from .inventory import SlurmInventory
from .job import SlurmJobStart
from .owners import ALLOCATION_COMMENT

__all__ = ["GPUPoolSlurmSpawner", "JOB_NAME", "command_argv", "mem_for_slurm", "shard_request"]

#: one for the hub process: a poll per server must not log slurmctld's outage once per server
slurm_outage = OutageLog(logging.getLogger("gpupool.spawner.slurm"))
#: seconds a submit, query or cancel may take before it counts as slurmctld not answering
COMMAND_TIMEOUT = 120.0


def hub_outage_log(log: logging.Logger) -> OutageLog:
    """The hub process's one :data:`slurm_outage`, writing to ``log`` (a spawner's: the hub's own logger).

    A logger of the package's own name has no handler in the hub: its warning came out bare (no
    time, no level) through Python's last resort, and its INFO "answers again" not at all.
    """
    slurm_outage.log = log
    return slurm_outage
#: seconds a spawn refused while slurmctld does not answer tells REST clients to wait (Retry-After)
RETRY_AFTER_OUTAGE = 30


def hub_executable(name: str) -> str:
    """``name`` as found on the *hub's* PATH (plus the sbin folders), not the server's.

    The commands run with the server's environment (``env_keep``), which JupyterHub 6
    builds without PATH: ``runuser`` (in /usr/sbin) was then not found at all.
    """
    if os.sep in name:
        return name
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/local/sbin", "/usr/sbin", "/sbin"])
    found = shutil.which(name, path=path)
    if found is None:
        raise GPUPoolRefused(f"{name} is not on the hub's PATH ({path}); install it or give its full path in "
                             "c.GPUPoolSlurmSpawner.exec_prefix / batch_*_cmd.", reason=SpawnFailure.CONFIG,
                             status_code=500)
    return found


def shard_request(node: str, gres_type: str, milli: int, per_gpu: int) -> str:
    """``--gres`` for a share of ``milli``/1000 of one ``gres_type`` GPU with ``per_gpu`` shards each.

    The share must be a whole number of shards (the start check, :mod:`gpupool_hub.engines.slurm.shares`,
    refuses profiles that are not): what Slurm holds is then exactly what the pool charges."""
    shards = milli * per_gpu / 1000
    if per_gpu <= 0 or shards != int(shards):
        why = ("has no shards (gres/shard)" if per_gpu <= 0 else
               f"has {per_gpu} shards per GPU, and {milli / 1000:g} of a GPU is not a whole number of them")
        raise GPUPoolRefused(f"Slurm cannot give {milli / 1000:g} of a GPU here: node {node}'s {gres_type} GPU "
                             f"{why}. Ask an admin to configure shards (docs/slurm.md, 'GPU shares').",
                             reason=SpawnFailure.CONFIG, status_code=500)
    return f"shard:{gres_type}:{int(shards)}"


#: every server job's name (what squeue shows; the 'slurm' usage preset knows servers by their comment)
JOB_NAME = "gpupool-server"


def mem_for_slurm(value: Any) -> str:
    """A profile's memory (bytes, or a string such as "4G") as sbatch ``--mem`` (MiB)."""
    if isinstance(value, str) and re.fullmatch(r"\d+[KMGT]?", value):
        return value
    return f"{max(int(value) // (1024 * 1024), 1)}M"


def command_argv(template: str, values: Mapping[str, Any]) -> list[str]:
    """A command template as argv: split into words first, then each word filled in.

    Filling in first and splitting after (what a shell does with batchspawner's
    command strings) lets a value add words or quotes: ``sudo -E -u {username}``
    with the username ``x -u root`` would run as root. Here a value lands inside
    the one word its placeholder is in, whatever it contains. A placeholder must
    therefore not contain spaces (``{username}``, ``{{username}}``).

    One word is not enough: ``sudo -u '#0'`` runs as uid 0, ``-u`` is an option. A
    value that starts with ``#`` or ``-`` is refused (403), whichever placeholder it fills.
    """
    try:
        words = shlex.split(template)
    except ValueError as e:
        raise GPUPoolRefused(f"Slurm command template {template!r} cannot be split into words: {e}",
                             reason=SpawnFailure.CONFIG, status_code=500) from None
    try:
        argv = [format_template(word, **values) for word in words]
    except (KeyError, IndexError, ValueError) as e:
        raise GPUPoolRefused(f"Slurm command template {template!r}: cannot fill in {e} (a placeholder must be "
                             "one word, e.g. {username})", reason=SpawnFailure.CONFIG, status_code=500) from None
    for key, value in values.items():
        if isinstance(value, str) and starts_unsafely(value) and _fills(words, values, key):
            raise GPUPoolRefused(f"The Slurm command {template!r} would get {value!r} as {{{key}}}: a value "
                                 f"starting with '#' or '-' is read as a uid or an option, so none is run "
                                 f"({RULE}).", reason=SpawnFailure.UNIX_NAME, status_code=403)
    return argv


_PROBE = "\0gpupool-probe\0"


def _fills(words: list[str], values: Mapping[str, Any], key: str) -> bool:
    """Whether ``values[key]`` goes into one of ``words`` (by any placeholder syntax: the words are filled
    in again with a marker in its place)."""
    probe = {**values, key: _PROBE}
    return any(_PROBE in format_template(word, **probe) for word in words)


class GPUPoolSlurmSpawner(GPUPoolSpawner, SlurmJobStart):
    """SlurmSpawner whose jobs run where the GPU pool placed them."""

    # the script: batchspawner's, with the hub's job name and the allocation as comment
    batch_script = Unicode(
        """#!/bin/bash
#SBATCH --output={{homedir}}/jupyterhub_slurmspawner_%j.log
#SBATCH --job-name={{job_name}}
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
{% if comment    %}#SBATCH --comment={{comment}}
{% endif %}{% if partition  %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime    %}#SBATCH --time={{runtime}}
{% endif %}{% if memory     %}#SBATCH --mem={{memory}}
{% endif %}{% if gres       %}#SBATCH --gres={{gres}}
{% endif %}{% if nodelist   %}#SBATCH --nodelist={{nodelist}}
{% endif %}{% if nprocs     %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if reservation%}#SBATCH --reservation={{reservation}}
{% endif %}{% if options    %}#SBATCH {{options}}{% endif %}

set -euo pipefail

trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
echo "jupyterhub-singleuser ended gracefully"
{{epilogue}}
"""
    ).tag(config=True)

    req_homedir = Unicode(
        help="Directory the job starts in and writes its log to (default: the user's Unix home).",
    ).tag(config=True)

    @default("req_homedir")
    def _default_homedir(self) -> str:
        return require_unix_account(self.user.name, self.config).pw_dir

    req_job_name = Unicode(JOB_NAME, help="Slurm job name of every server.")
    req_nodelist = Unicode("", help="Set per spawn: the node the pool chose (--nodelist).")
    req_comment = Unicode("", help="Set per spawn: gpupool-allocation=<id> (--comment).")
    #: set per spawn: (GRES type, milli) of a share of one GPU, asked of Slurm as shards; None: whole GPUs
    gpupool_share: tuple[str, int] | None = None
    #: the job may wait in Slurm's queue once its GPUs are held: charged from its StartTime (issue 48.3)
    gpupool_pending_start = True
    _gpupool_recording: asyncio.Future[None] | None = None

    # squeue -h -j 42 -o '%T %B %r'  ->  "RUNNING gpu-a None" / "PENDING n/a Resources"
    batch_query_cmd = Unicode("squeue -h -j {job_id} -o '%T %B %r'").tag(config=True)
    state_exechost_re = Unicode(r"^\S+\s+([\w.-]+)").tag(config=True)
    # the pending reason, last word of the line above
    state_reason_re = Unicode(r"^PENDING\s+\S+\s+(\S+)").tag(config=True)

    slurm_gpu_models = Dict(
        help="GRES type -> GPU model; default: c.GPUPool.slurm_gpu_models (the service's map).",
    ).tag(config=True)

    slurm_env = Dict(
        help="Environment for sbatch/squeue/scancel/scontrol on top of the hub's; default: "
             "SLURM_CONF from c.GPUPool.slurm_conf when set.",
    ).tag(config=True)

    node_addresses = Dict(
        help="Slurm node name -> address the hub reaches its servers at (default: the node name).",
    ).tag(config=True)

    @default("slurm_gpu_models")
    def _default_models(self) -> dict[str, str]:
        return dict(self.config.GPUPool.get("slurm_gpu_models", {})) if "GPUPool" in self.config else {}

    @default("slurm_env")
    def _default_slurm_env(self) -> dict[str, str]:
        conf = self.config.GPUPool.get("slurm_conf", "") if "GPUPool" in self.config else ""
        return {"SLURM_CONF": conf} if conf else {}

    def gpupool_check_user(self) -> None:
        """The job is submitted, queried and cancelled as the user (``exec_prefix``'s ``{username}``):
        the hub's user name, and ``req_username`` if set otherwise, must be a Unix login name with
        an account on the hub's machine (unixname.RULE), else 403 before the pool is asked."""
        for name in dict.fromkeys([self.user.name, self.req_username]):
            require_unix_account(name, self.config)

    # ------------------------------------------------------- allocation

    def gpupool_env(self, allocation: dict[str, Any] | None) -> dict[str, str]:
        env = super().gpupool_env(allocation)
        if allocation:  # Slurm sets CUDA_VISIBLE_DEVICES for the GPUs it binds
            env.pop("CUDA_VISIBLE_DEVICES", None)
            env.pop("NVIDIA_VISIBLE_DEVICES", None)
        return env

    def gres_type(self, model: str) -> str:
        for gres_type, name in sorted(self.slurm_gpu_models.items()):
            if name == model:
                return gres_type
        raise GPUPoolRefused(
            f"GPU model {model!r} has no Slurm GRES type in c.GPUPool.slurm_gpu_models; ask an admin to add it.",
            reason=SpawnFailure.CONFIG, status_code=500,
        )

    def apply_gpupool_allocation(self, allocation: dict[str, Any] | None) -> None:
        super().apply_gpupool_allocation(allocation)
        values: dict[str, Any] = {}
        profile = self.gpupool_profile
        if profile is not None and profile.cpu is not None:
            values["req_nprocs"] = str(max(int(round(profile.cpu)), 1))
        if profile is not None and profile.memory is not None:
            values["req_memory"] = mem_for_slurm(profile.memory)
        self.gpupool_share = None
        if allocation:
            gpus = allocation.get("gpus", [])
            # the pool's allocation gives a share as "fraction" ("0.5"); before issue 40.3 this read a
            # "milli" it never has, so a share was submitted as a whole GPU
            milli = int(Decimal(str(gpus[0].get("fraction", 1))) * 1000) if len(gpus) == 1 else 1000
            if milli < 1000:
                # a share of one GPU: Slurm's shards (gres/shard); how many is read from the node
                # when the job is submitted (submit_batch_script), here only what is asked
                self.gpupool_share = (self.gres_type(gpus[0]["model"]), milli)
                values["req_gres"] = ""
            else:
                counts: dict[str, int] = {}
                for g in gpus:
                    t = self.gres_type(g["model"])
                    counts[t] = counts.get(t, 0) + 1
                values["req_gres"] = ",".join(f"gpu:{t}:{n}" for t, n in sorted(counts.items()))
            values["req_nodelist"] = allocation["node"]
            values["req_comment"] = f"{ALLOCATION_COMMENT}{allocation['id']}"  # whose bill (usage preset 'slurm')
        self.gpupool_allocation_overrides.set(values)

    # ----------------------------------------------------- batchspawner

    async def _get_batch_script(self, **subvars: Any) -> str:
        # batchspawner adds the raw user options to the template variables; only req_* traits go in
        clean = self.get_req_subvars()
        clean["cmd"] = subvars["cmd"]
        return await super()._get_batch_script(**clean)

    def slurm_argv(self, command: str, **extra: Any) -> list[str]:
        """``exec_prefix`` + ``command`` as argv, the ``req_*`` values (and ``extra``) filled into single words."""
        values = {**self.get_req_subvars(), **extra}
        return command_argv(self.exec_prefix, values) + command_argv(command, values)

    async def run_argv(self, argv: list[str], input: str | None = None, env: dict[str, str] | None = None) -> str:
        """Run ``argv`` without a shell, with the Slurm environment, through the engine's one runner
        (``commands.run_slurm``, off the event loop); RuntimeError(stderr) on failure. The submit (its batch
        script on ``input``) hands the server's environment to the job as it is."""
        full_env = dict(os.environ if env is None else env)
        full_env.update(self.slurm_env)
        run = functools.partial(run_slurm, [hub_executable(argv[0]), *argv[1:]], env=full_env,
                                timeout=COMMAND_TIMEOUT, input=input, job_env=input is not None)
        try:
            out = await asyncio.get_running_loop().run_in_executor(None, run)
        except SlurmCommandError as e:
            message = e.stderr or str(e)
            if controller_unreachable(message):
                hub_outage_log(self.log).failed(message)  # once per outage, not once per poll of every server
            else:
                self.log.error("%s failed: %s", argv[0], message)
            raise RuntimeError(message) from None
        hub_outage_log(self.log).ok()
        return out.strip()

    async def run_command(self, cmd: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
        """batchspawner's seam for a command *string*: this spawner builds argv itself
        (:meth:`slurm_argv`); a string can no longer be split safely, so none is run."""
        raise RuntimeError("GPUPoolSlurmSpawner runs commands as argv lists (slurm_argv/run_argv), never as "
                           f"a command string: {cmd[:100]!r}")

    # batchspawner's three commands, as argv (its versions join the filled-in templates into one string)

    async def shard_gres(self, node: str, gres_type: str, milli: int) -> str:
        """``shard:<type>:<n>`` for a share of ``milli``/1000 of one GPU of ``node``: n shards of the
        node's shards per GPU (``Gres=gpu:a6000:2,shard:a6000:16``: 8 per GPU, half = 8). Slurm picks
        which GPU's shards; :meth:`gpupool_record_bound_gpus` moves the pool's share there."""
        nodes = await asyncio.get_running_loop().run_in_executor(None, self.slurm_inventory().nodes)
        per_gpu = next((n.shards_per_gpu.get(gres_type, 0) for n in nodes if n.name == node), 0)
        return shard_request(node, gres_type, milli, per_gpu)

    async def submit_batch_script(self) -> str:
        if self.gpupool_share is not None and self.gpupool_allocation:
            gres = await self.shard_gres(self.gpupool_allocation["node"], *self.gpupool_share)
            self.gpupool_allocation_overrides.set({"req_gres": gres})
        argv = self.slurm_argv(self.batch_submit_cmd)
        script = await self._get_batch_script(cmd=self.cmd_formatted_for_batch())
        self.log.info("Submitting the server of %s: %s", self._log_name, argv)
        self.log.debug("Batch script:\n%s", script)
        try:
            out = await self.run_argv(argv, input=script, env=self.get_env())
        except RuntimeError as e:
            message = str(e)
            if controller_unreachable(message):
                raise GPUPoolRefused(
                    f"Slurm does not answer, so no server can start right now; try again in a minute. "
                    f"sbatch said: {message}", reason=SpawnFailure.SCHEDULER_DOWN,
                    status_code=503, retry_after=RETRY_AFTER_OUTAGE) from None
            raise
        try:
            self.job_id = self.parse_job_id(out)
        except Exception:
            self.log.error("Job submission of %s failed: %s", self._log_name, out)
            self.job_id = ""
        return self.job_id

    async def query_job_status(self) -> JobStatus:
        if not self.job_id:
            self.job_status = ""
            return JobStatus.NOTFOUND
        try:
            self.job_status = await self.run_argv(self.slurm_argv(self.batch_query_cmd, job_id=self.job_id))
        except RuntimeError as e:  # squeue's stderr: the state_unknown_re patterns read it
            self.job_status = e.args[0] if e.args else ""
            if not job_ended(None, self.job_status):  # not "Invalid job id": squeue could not say (issue 48.2)
                return JobStatus.UNKNOWN
        except Exception:
            self.log.exception("Error querying job %s", self.job_id)
            self.job_status = ""
            return JobStatus.UNKNOWN
        if self.state_isrunning():
            return JobStatus.RUNNING
        if self.state_ispending():
            return JobStatus.PENDING
        if self.state_isunknown():
            return JobStatus.UNKNOWN
        return JobStatus.NOTFOUND

    def gpupool_work_end(self) -> WorkEnd:
        """The job, by id, with this server's query and cancel commands (as the user): the GPUs go
        back only once it left squeue or ended there (:mod:`.ends`)."""
        if not self.job_id:
            return NothingRan("no Slurm job")
        query = self.slurm_argv(self.batch_query_cmd, job_id=self.job_id)
        cancel = self.slurm_argv(self.batch_cancel_cmd, job_id=self.job_id)
        return JobEnd(int(self.job_id), functools.partial(self.run_argv, query),
                      functools.partial(self.run_argv, cancel))

    async def cancel_batch_job(self) -> None:
        argv = self.slurm_argv(self.batch_cancel_cmd, job_id=self.job_id)
        self.log.info("Cancelling job %s: %s", self.job_id, argv)
        await self.run_argv(argv)

    def state_gethost(self) -> str:
        node = super().state_gethost()
        return self.node_addresses.get(node, node)

    def state_reason(self) -> str | None:
        m = re.search(self.state_reason_re, self.job_status or "")
        return m.group(1) if m else None

    async def progress(self) -> Any:
        async for event in super().progress():
            if event.get("message") == "Pending in queue...":
                event = {**event, "message": f"queued in Slurm: {self.state_reason() or 'pending'}"}
            yield event

    # ------------------------------------------------ real GPU indices

    def slurm_inventory(self) -> SlurmInventory:
        return SlurmInventory(self.slurm_gpu_models, env=self.slurm_env or None)

    async def gpupool_record_bound_gpus(self) -> bool:
        """Tell the pool when the job started (its charge starts then: nothing while it was pending)
        and which GPUs Slurm bound to it (it may differ from the pool's guess; the pool swaps bookings
        with another allocation that stands on them). True once the service took it, or the job or
        allocation is gone (nothing to tell); False to be tried again (slurmctld or the service down)."""
        alloc = self.gpupool_allocation
        if not alloc or not self.job_id:
            return True
        try:
            job = await asyncio.get_running_loop().run_in_executor(
                None, self.slurm_inventory().job, int(self.job_id))
        except (SlurmError, ValueError) as e:
            self.log.warning("Could not read the GPUs of job %s: %s", self.job_id, e)
            return False
        if job is None:
            return True
        indices = list(job.shard_indices(alloc["node"]) if self.gpupool_share is not None
                       else job.gpu_indices(alloc["node"]))
        body: dict[str, Any] = {"started_at": (job.start_time or datetime.now(timezone.utc)).isoformat()}
        if indices:
            body["gpu_indices"] = indices
        try:
            status, answer = await self.gpupool_request("PATCH", f"/allocations/{quote(alloc['id'], safe='')}", body)
        except ServiceUnavailable as e:
            self.log.warning("Could not tell the pool about job %s: %s", self.job_id, e)
            return False
        if status == 200:
            self.gpupool_allocation = answer["allocation"]
            self.log.info("Job %s of %s started at %s on GPUs %s of %s", self.job_id, self._log_name,
                          body["started_at"], indices, alloc["node"])
        elif status != 404:
            self.log.warning("The pool did not take GPUs %s of job %s: %s %s", indices, self.job_id, status, answer)
        return status in (200, 404)

    async def _record_until_taken(self) -> None:
        """Retry :meth:`gpupool_record_bound_gpus` until the service takes it (an outage of slurmctld or
        of the service, a swap that does not fit yet): the pool and Slurm must end up agreeing."""
        while not await self.gpupool_record_bound_gpus():
            await asyncio.sleep(self.release_retry_interval)

    async def start(self) -> Any:
        result = await super().start()
        if not await self.gpupool_record_bound_gpus():  # tried again in the background until it is taken
            self._gpupool_recording = asyncio.ensure_future(self._record_until_taken())
        return result
