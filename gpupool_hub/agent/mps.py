"""Capping ``mps`` shares through NVIDIA MPS: one control daemon per GPU, the caps set by the agent.

A variable in the user's environment (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) is
a limit the user may raise. The caps that hold are the MPS server's, set
through its control daemon, which only root (the agent) talks to. So for each
GPU holding an ``mps`` share the agent:

1. runs ``nvidia-cuda-mps-control -d`` with the GPU alone visible
   (``CUDA_VISIBLE_DEVICES=<uuid>``) and a pipe directory of its own
   (``<mps_root>/<uuid>/pipe``; the spawner points the server there through
   ``CUDA_MPS_PIPE_DIRECTORY``), unless its pid file names a live daemon;
2. sets the defaults every new MPS server of that GPU starts with:
   ``set_default_device_pinned_mem_limit 0 <N>M`` (the share of the GPU's
   memory) and ``set_default_active_thread_percentage <P>`` (the share of its
   SMs, rounded up), then starts the holder's server (``start_server -uid``)
   so it exists, capped, before the user's first CUDA call;
3. sets the same caps on every server already running
   (``set_device_pinned_mem_limit <pid> 0 <N>M``, ``set_active_thread_percentage
   <pid> <P>``): they hold for the clients that connect from then on.

Commands go to the daemon's standard input; the binary is run from an argv
list, never through a shell, and a command holds only numbers the agent
computed (the uid from the password database, never the user's name).

What MPS cannot do: a client connected before its server was capped keeps the
limits it connected with, and a process that does not use the pipe directory
is no MPS client at all. Both stay under the memory guard, which watches
``mps`` shares like ``timeslice`` ones.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .attribution import Snapshot
from .memguard import Share

log = logging.getLogger("gpupool.agent.mps")

_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9-]{1,80}$")
PID_FILE = "nvidia-cuda-mps-control.pid"


@dataclass(frozen=True)
class MpsCap:
    """What one GPU's MPS servers may use: its ``mps`` holder's memory and SM share."""

    user: str
    memory_mib: int
    threads: int  # active thread percentage, 1-100

    def commands(self) -> list[str]:
        return [f"set_default_device_pinned_mem_limit 0 {self.memory_mib}M",
                f"set_default_active_thread_percentage {self.threads}"]

    def server_commands(self, pid: int) -> list[str]:
        return [f"set_device_pinned_mem_limit {pid} 0 {self.memory_mib}M",
                f"set_active_thread_percentage {pid} {self.threads}"]


def plan(snapshot: Snapshot, shares: Iterable[Share]) -> dict[str, MpsCap]:
    """GPU UUID -> the caps of its ``mps`` share (pure). A user's several servers there add up;
    a GPU whose memory NVML does not report gets no cap (nothing to compute it from)."""
    held: dict[str, dict[str, int]] = {}
    for s in shares:
        if s.share_class == "mps":
            users = held.setdefault(s.gpu_uuid, {})
            users[s.user] = users.get(s.user, 0) + s.milli
    total = {g.uuid: g.memory_total_bytes for g in snapshot.gpus}
    out = {}
    for uuid, users in sorted(held.items()):
        if uuid not in total or not total[uuid]:
            continue
        if len(users) > 1:  # the config check refuses this; never guess whose cap it is
            log.warning("GPU %s has mps shares of several users (%s): MPS serves one user at a time; "
                        "not capping it", uuid, ", ".join(sorted(users)))
            continue
        (user, milli), = users.items()
        milli = min(milli, 1000)
        out[uuid] = MpsCap(user, total[uuid] * milli // 1000 >> 20, max(1, min(100, math.ceil(milli / 10))))
    return out


@dataclass
class MpsControl:
    """The control daemons of this node's ``mps`` GPUs, and the caps last set on each."""

    binary: str = "nvidia-cuda-mps-control"
    root: str = "/run/gpupool-mps"
    timeout: float = 10.0
    applied: dict[str, MpsCap] = field(default_factory=dict)
    capped: dict[str, dict[int, MpsCap]] = field(default_factory=dict)  # GPU -> server pid -> its caps

    def pipe_dir(self, uuid: str) -> Path:
        if not _UUID.match(uuid):
            raise ValueError(f"not a GPU UUID: {uuid!r}")
        return Path(self.root) / uuid / "pipe"

    def _env(self, uuid: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
        pipe = self.pipe_dir(uuid)
        return env | {"CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                      "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log")}

    def running(self, uuid: str) -> bool:
        try:
            pid = int((self.pipe_dir(uuid) / PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return psutil.pid_exists(pid)

    def ensure_daemon(self, uuid: str) -> None:
        """Start the GPU's control daemon unless it runs; a new daemon has no caps yet."""
        if self.running(uuid):
            return
        pipe = self.pipe_dir(uuid)
        for d in (pipe, pipe.parent / "log"):
            d.mkdir(parents=True, exist_ok=True)
        # clients of other users must reach the pipes; only root may write the directories
        os.chmod(pipe.parent, 0o755)
        os.chmod(pipe, 0o755)
        self._run([self.binary, "-d"], uuid, None)
        self.applied.pop(uuid, None)
        self.capped.pop(uuid, None)
        log.info("Started the MPS control daemon of GPU %s (pipes in %s)", uuid, pipe)

    def command(self, uuid: str, line: str) -> str:
        """One command to the GPU's daemon, on its standard input; its answer."""
        return self._run([self.binary], uuid, line + "\n")

    def _run(self, argv: list[str], uuid: str, stdin: str | None) -> str:
        done = subprocess.run(argv, input=stdin, env=self._env(uuid), capture_output=True, text=True,
                              timeout=self.timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} ({stdin.strip() if stdin else 'start'}) for GPU {uuid} "
                               f"exited {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout

    def servers(self, uuid: str) -> list[int]:
        return [int(w) for w in self.command(uuid, "get_server_list").split() if w.isdigit()]

    def keep(self, caps: dict[str, MpsCap]) -> list[str]:
        """Bring each GPU's daemon and servers to its caps; returns what failed, per GPU (logged)."""
        failed = []
        for uuid, cap in sorted(caps.items()):
            try:
                self._keep_one(uuid, cap)
            except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
                failed.append(f"{uuid}: {e}")
                log.warning("Could not cap the mps share of %s on GPU %s: %s", cap.user, uuid, e)
        for uuid in set(self.applied) - set(caps):
            self.applied.pop(uuid)
            self.capped.pop(uuid, None)
        return failed

    def _keep_one(self, uuid: str, cap: MpsCap) -> None:
        self.ensure_daemon(uuid)
        if self.applied.get(uuid) != cap:
            for line in cap.commands():
                self.command(uuid, line)
            self.applied[uuid] = cap
            log.info("MPS caps of GPU %s for %s: %d MiB pinned device memory, %d %% of its SMs",
                     uuid, cap.user, cap.memory_mib, cap.threads)
        servers = self.servers(uuid)
        capped = self.capped.setdefault(uuid, {})
        for pid in list(capped):
            if pid not in servers:
                del capped[pid]
        for pid in servers:
            if capped.get(pid) != cap:
                for line in cap.server_commands(pid):
                    self.command(uuid, line)
                capped[pid] = cap
        if not servers:
            try:
                uid = pwd.getpwnam(cap.user).pw_uid
            except KeyError:
                log.warning("No Unix account %r: its MPS server of GPU %s starts with its first CUDA call "
                            "(with the default caps)", cap.user, uuid)
                return
            self.command(uuid, f"start_server -uid {uid}")
