"""Environment hints that keep a time-shared GPU fraction to its memory.

Time-slicing does not isolate memory, so the node agent's memory guard stops
processes that hold more than their share (``agent/memguard.py``). These
variables help the user's code stay inside the share in the first place; each
is honoured only by what reads it (see docs/user-guide.md):

* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=<N>M``): a cap the CUDA driver keeps
  for clients of an MPS control daemon; ignored without MPS, and the user may
  change it, so for ``mps`` shares the agent sets the cap that holds, on the
  server, through the daemon. Set only when the pool knows the GPU's memory.
* ``CUDA_MPS_PIPE_DIRECTORY``: only for ``mps`` shares, where the GPU's control
  daemon listens; CUDA then runs the server's processes as MPS clients. Device ``0`` is the first visible
  device, which is the share's GPU (``CUDA_VISIBLE_DEVICES`` names only it).
* ``XLA_PYTHON_CLIENT_MEM_FRACTION``: JAX preallocates this fraction of the GPU
  (75 % by default, which would overrun any share below it).
* ``TF_FORCE_GPU_ALLOW_GROWTH=true``: TensorFlow allocates as it needs instead
  of grabbing nearly all the GPU's memory at start.
* ``GPUPOOL_GPU_FRACTION``, ``GPUPOOL_GPU_MEMORY_LIMIT_MIB``: for code that caps
  itself, e.g. PyTorch (``torch.cuda.set_per_process_memory_fraction``), which
  no environment variable can cap (``PYTORCH_CUDA_ALLOC_CONF`` tunes the
  caching allocator, it sets no limit).

Whole GPUs and MIG instances get none of these: nothing shares their memory.

Also here, for the same reader (the user's code): ``GPUPOOL_NOTICE_FILE``,
where the server's pending stop is written (:mod:`gpupool_hub.notice`).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

from ..notice import NOTICE_FILE_ENV

_UUID = re.compile(r"^GPU-[A-Za-z0-9-]{1,80}$")


def share_memory_env(allocation: dict[str, Any], mps_root: str = "/run/gpupool-mps") -> dict[str, str]:
    """The hints for an allocation holding one fraction of a GPU; ``{}`` otherwise. An ``mps`` share
    also gets the pipe directory of its GPU's MPS control daemon (``<mps_root>/<uuid>/pipe``), run
    and capped by the node agent (``agent/mps.py``)."""
    gpus = allocation.get("gpus") or []
    if len(gpus) != 1 or gpus[0].get("mig_uuid"):
        return {}
    try:
        fraction = Decimal(str(gpus[0].get("fraction", "1")))
    except InvalidOperation:
        return {}
    if not 0 < fraction < 1:
        return {}
    text = f"{fraction.normalize():f}"
    env = {"GPUPOOL_GPU_FRACTION": text, "XLA_PYTHON_CLIENT_MEM_FRACTION": text, "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    memory_mib = int(gpus[0].get("memory_mib") or 0)
    if memory_mib > 0:
        limit = int(memory_mib * fraction)
        env["GPUPOOL_GPU_MEMORY_LIMIT_MIB"] = str(limit)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    if gpus[0].get("share") == "mps" and _UUID.match(str(gpus[0].get("uuid", ""))):
        env["CUDA_MPS_PIPE_DIRECTORY"] = f"{mps_root.rstrip('/')}/{gpus[0]['uuid']}/pipe"
    return env


def notice_file_env(template: str, server_name: str) -> dict[str, str]:
    """``GPUPOOL_NOTICE_FILE`` from ``c.GPUPoolSpawner.notice_file``; ``{}`` when that is empty.

    The server's name is quoted (``%2F`` for a slash) so that no name reaches outside the folder."""
    if not template:
        return {}
    name = quote(server_name or "default", safe="")
    if name in (".", ".."):  # quote leaves dots alone
        name = name.replace(".", "%2E")
    return {NOTICE_FILE_ENV: template.replace("{server}", name)}
