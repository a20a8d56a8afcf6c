#!/usr/bin/env python3
"""A stand-in for ``nvidia-cuda-mps-control`` (NVIDIA's MPS control daemon), the one fake
besides NVML: it records every call (argv, the GPU it was started for, its pipe directory
and the command on stdin) as a JSON line in ``<pipe dir>/../commands.jsonl``.

``-d`` starts a detached "daemon" (a sleeping process) and writes its pid to the pipe
directory's ``nvidia-cuda-mps-control.pid``, as the real one does; ``start_server -uid N``
makes that pid the one server ``get_server_list`` lists; ``quit`` stops the daemon.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
pid_file = pipe / "nvidia-cuda-mps-control.pid"
servers = pipe / "servers"
stdin = "" if "-d" in sys.argv[1:] else sys.stdin.read()
with open(pipe.parent / "commands.jsonl", "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                          "pipe": str(pipe), "stdin": stdin.strip()}) + "\n")
if sys.argv[1:] == ["-d"]:
    daemon = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
                              start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    pid_file.write_text(f"{daemon.pid}\n")
    sys.exit(0)
if not pid_file.exists():
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
for line in stdin.splitlines():
    words = line.split()
    if words == ["get_server_list"]:
        print(servers.read_text().strip() if servers.exists() else "")
    elif words[:2] == ["start_server", "-uid"] and words[2].isdigit():
        servers.write_text(pid_file.read_text())
    elif words == ["quit"]:
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        pid_file.unlink()
