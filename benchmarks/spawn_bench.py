"""Spawn overhead of GPUPoolSimpleSpawner over plain SimpleLocalProcessSpawner, 1,000-GPU pool.

Runs the real gpupool service (a subprocess, SQLite ledger, 125 nodes x 8 GPUs)
and, in this process, real spawner objects that start real processes. Each
round starts one server with the plain spawner and one with the gpupool
spawner (alternating which goes first) and times ``start()``; the gpupool
spawner's extra time is the balance check + placement + ledger write round
trip to the service. Servers stay up, so the pool fills as the rounds go on;
at the end every gpupool server is stopped and ``stop()``'s release is timed
the same way.

    .venv/bin/python benchmarks/spawn_bench.py [--rounds 200]

Prints figures and the target; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets.config import Config

from gpupool_hub.engines.local.spawner import GPUPoolSimpleSpawner

TARGET_MS = 50.0
NODES = [
    {"name": f"node-{i:03d}", "cpu_milli": 128000, "memory_mib": 1048576,
     "gpus": {"count": 8, "model": "NVIDIA A100-SXM4-80GB" if i % 2 else "NVIDIA GeForce RTX 3090"},
     "links": [{"gpus": [0, 1], "nvlinks": 12}, {"gpus": [2, 3], "nvlinks": 12},
               {"gpus": [4, 5], "nvlinks": 12}, {"gpus": [6, 7], "nvlinks": 12}]}
    for i in range(125)
]
PROFILES = [
    {"slug": "1gpu", "display_name": "1 GPU", "gpus": 1},
    {"slug": "2x3090", "display_name": "2x RTX 3090", "gpus": 2, "models": ["RTX 3090"]},
    {"slug": "quarter", "display_name": "1/4 A100", "gpu_fraction": 0.25, "models": ["A100"]},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(workdir: Path, token: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = workdir / "jupyterhub_config.py"
    config.write_text(
        "c = get_config()  # noqa\n"
        f"c.GPUPool.prices = {{'RTX 3090': 1, 'A100': 3}}\n"
        f"c.GPUPool.nodes = {NODES!r}\n"
        f"c.GPUPool.db_url = 'sqlite:///{workdir}/gpupool.sqlite'\n"
        "c.GPUPool.initial_grant = 100000\n"
        "c.GPUPoolService.run_jobs = False\n"
        f"c.GPUPoolService.spawner_token = {token!r}\n"  # the spawner's secret; the hub token below differs
    )
    env = {**os.environ, "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
           "JUPYTERHUB_API_TOKEN": secrets.token_hex(16),
           "JUPYTERHUB_SERVICE_PREFIX": "/services/gpupool/",
           "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api"}
    proc = subprocess.Popen([sys.executable, "-m", "gpupool_hub.service", "--config", str(config)],
                            env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=open(workdir / "service.log", "wb"))
    api = f"http://127.0.0.1:{port}/services/gpupool/api/v1"
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(api + "/", timeout=2)
            return proc, api
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"service exited: {(workdir / 'service.log').read_text()[-2000:]}")
            time.sleep(0.2)
    raise SystemExit("service did not come up")


def make_spawner(cls, name: str, config: Config, workdir: Path):
    user = SimpleNamespace(name=name, groups=[], url=f"/user/{name}/", escaped_name=name, id=1)
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/",
                          url="http://127.0.0.1:8081/hub/", public_host="", host="")
    spawner = cls(user=user, hub=hub, config=config)
    spawner.home_dir_template = str(workdir / "home" / "{username}")
    return spawner


async def run(rounds: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="spawn-bench-"))
    token = secrets.token_hex(16)
    proc, api = start_service(workdir, token)
    try:
        config = Config()
        config.Spawner.cmd = ["sleep", "600"]
        config.GPUPoolSpawner.profiles = PROFILES
        config.GPUPoolSpawner.gpupool_api_url = api
        config.GPUPoolSpawner.gpupool_api_token = token
        config.GPUPool.nodes = NODES
        rng = random.Random(7)
        plain_ms: list[float] = []
        pool_ms: list[float] = []
        running = []
        # warm up both paths (imports, HTTP client, SQLite) outside the figures
        for i in range(5):
            for cls in (SimpleLocalProcessSpawner, GPUPoolSimpleSpawner):
                s = make_spawner(cls, f"warm{i}", config, workdir)
                s.user_options = {"profile": "1gpu"}
                await s.start()
                await s.stop(now=True)
        for i in range(rounds):
            order = [SimpleLocalProcessSpawner, GPUPoolSimpleSpawner]
            if i % 2:
                order.reverse()
            for cls in order:
                s = make_spawner(cls, f"user{i:04d}", config, workdir)
                s.user_options = {"profile": rng.choice(PROFILES)["slug"]}
                t0 = time.perf_counter()
                await s.start()
                elapsed = (time.perf_counter() - t0) * 1000
                (plain_ms if cls is SimpleLocalProcessSpawner else pool_ms).append(elapsed)
                running.append(s)
        held = sum(1 for s in running if getattr(s, "gpupool_allocation_id", None))
        stop_plain: list[float] = []
        stop_pool: list[float] = []
        for s in running:
            t0 = time.perf_counter()
            await s.stop(now=True)
            elapsed = (time.perf_counter() - t0) * 1000
            (stop_pool if isinstance(s, GPUPoolSimpleSpawner) else stop_plain).append(elapsed)
    finally:
        proc.terminate()
        proc.wait(10)
    med_plain, med_pool = statistics.median(plain_ms), statistics.median(pool_ms)
    return {
        "rounds": rounds, "pool_gpus": 8 * len(NODES), "allocations_held_at_peak": held,
        "plain_start_ms_median": round(med_plain, 2), "gpupool_start_ms_median": round(med_pool, 2),
        "spawn_overhead_ms_median": round(med_pool - med_plain, 2),
        "spawn_overhead_ms_p90": round(statistics.quantiles(pool_ms, n=10)[8] - statistics.quantiles(plain_ms, n=10)[8], 2),
        "stop_overhead_ms_median": round(statistics.median(stop_pool) - statistics.median(stop_plain), 2),
        "target_ms": TARGET_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    result = asyncio.run(run(args.rounds))
    ok = result["spawn_overhead_ms_median"] <= TARGET_MS
    result["ok"] = ok
    print(f"pool: {result['pool_gpus']} GPUs on {len(NODES)} nodes; {result['rounds']} spawns per spawner, "
          f"{result['allocations_held_at_peak']} GPU servers held at the end")
    print(f"start() median: plain {result['plain_start_ms_median']} ms, "
          f"gpupool {result['gpupool_start_ms_median']} ms")
    print(f"extra time per spawn: median {result['spawn_overhead_ms_median']} ms "
          f"(p90 {result['spawn_overhead_ms_p90']} ms); target <= {TARGET_MS} ms: {'OK' if ok else 'MISSED'}")
    print(f"extra time per stop (release): median {result['stop_overhead_ms_median']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
