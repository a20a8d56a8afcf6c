"""GET me while another process holds the ledger's write lock (issue 12, item 3).

The service runs under a real JupyterHub over a SQLite ledger. 50 clients poll
``GET me`` (one keep-alive connection each, closed loop), twice:

- lock-free: a fixed number of requests, nothing else going on;
- lock held: a second process takes the SQLite write lock (``BEGIN
  IMMEDIATE``) and keeps it for 10 s, while an admin client posts grants in a
  loop (each waits for the lock at most ``db_write_timeout``, then gets 503).
  The 50 clients poll until the lock is released.

Target: GET me p99 <= 50 ms while the lock is held. Before the writer thread,
one waiting grant froze the event loop and every GET me took seconds.

Needs configurable-http-proxy (scripts/setup-env.sh). The last line printed is
one JSON object.

    .venv/bin/python benchmarks/lock_bench.py [--requests 4000] [--hold 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


class Client:
    """One keep-alive HTTP/1.1 connection to the service."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token {self.token}\r\n"
                f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n").encode()
        self.writer.write(head + body)
        answer = await self.reader.readuntil(b"\r\n\r\n")
        status = int(answer.split(b" ", 2)[1])
        length = int(answer.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def poll_me(clients: list[Client], path: str, until: "asyncio.Future[None] | None", n: int) -> list[float]:
    """Closed-loop GET me on every client: ``n`` requests in all, or until ``until`` is done."""
    latencies: list[float] = []
    remaining = n

    async def run(client: Client) -> None:
        nonlocal remaining
        while (until is None and remaining > 0) or (until is not None and not until.done()):
            remaining -= 1
            t = time.perf_counter()
            status, body = await client.request("GET", path)
            latencies.append((time.perf_counter() - t) * 1000)
            assert status == 200 and body.startswith(b"{"), (status, body[:200])

    await asyncio.gather(*(run(c) for c in clients))
    return latencies


async def grant_loop(admin: Client, api: str, user: str, until: "asyncio.Future[None]") -> list[tuple[int, float]]:
    """Grants posted back to back while the lock is held: (status, seconds) each."""
    results = []
    body = json.dumps({"amount": "1", "reason": "lock bench"}).encode()
    while not until.done():
        t = time.perf_counter()
        status, _ = await admin.request("POST", f"{api}/users/{user}/grant", body)
        results.append((status, time.perf_counter() - t))
    return results


async def bench(tmp: Path, n_requests: int, concurrency: int, hold: float) -> dict[str, float]:
    from tests.fixtures.hub import Hub, find_chp

    if find_chp() is None:
        raise SystemExit("configurable-http-proxy is missing: run scripts/setup-env.sh")
    (tmp / "hub").mkdir()
    hub = Hub(tmp / "hub")
    hub.start()
    try:
        api = "/services/gpupool/api/v1"
        clients = []
        for i in range(concurrency):
            hub.create_user(f"client{i}")
            clients.append(Client(hub.service_port, hub.token_for(f"client{i}")))
        hub.create_user("granted")
        admin = Client(hub.service_port, hub.tester_token)
        for c in [*clients, admin]:
            await c.open()
        for c in clients:  # warm: account opened, token checked once by the hub
            assert (await c.request("GET", f"{api}/me"))[0] == 200
        assert (await admin.request("GET", f"{api}/users/granted"))[0] == 200

        free = await poll_me(clients, f"{api}/me", None, n_requests)

        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(hub.workdir / "gpupool.sqlite"), str(hold)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            released = asyncio.get_running_loop().run_in_executor(None, holder.wait)
            grants_task = asyncio.ensure_future(grant_loop(admin, api, "granted", released))
            held = await poll_me(clients, f"{api}/me", released, 0)
            grants = await grants_task
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
        after = await admin.request("POST", f"{api}/users/granted/grant",
                                    json.dumps({"amount": "1", "reason": "after"}).encode())
        for c in [*clients, admin]:
            c.close()
        busy = [s for s, _ in grants if s == 503]
        return {
            "me_p99_ms_lock_free": round(p99(free), 2), "me_p99_ms_lock_held": round(p99(held), 2),
            "me_requests_lock_held": len(held), "grants_503_while_held": len(busy),
            "grant_max_wait_s": round(max((t for _, t in grants), default=0), 2),
            "grant_after_release_status": after[0],
        }
    finally:
        hub.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000, help="GET me requests in the lock-free run")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--hold", type=float, default=10, help="seconds the other process holds the write lock")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(bench(Path(tmp), args.requests, args.concurrency, args.hold))
    print(f"{'figure':<28} {'measured':>10} {'target':>10}")
    print(f"{'me_p99_ms_lock_free':<28} {result['me_p99_ms_lock_free']:>10} {'<= 20':>10}  "
          f"({args.concurrency} clients, {args.requests} requests)")
    print(f"{'me_p99_ms_lock_held':<28} {result['me_p99_ms_lock_held']:>10} {'<= 50':>10}  "
          f"({result['me_requests_lock_held']} requests while the lock was held {args.hold:g} s)")
    print(f"{'grants_503_while_held':<28} {result['grants_503_while_held']:>10} {'-':>10}  "
          f"(longest wait {result['grant_max_wait_s']} s; after release: {result['grant_after_release_status']})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
