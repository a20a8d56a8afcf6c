"""A minimal single-user "server" for spawner tests: a real process the hub starts and stops.

It listens where JupyterHub says (``JUPYTERHUB_SERVICE_URL``), answers every
GET (so the hub's readiness check on ``…/api`` passes) with JSON holding its pid
and the GPU-related environment, and exits on SIGINT/SIGTERM. Standard library
only, so 30 of them start in well under a second each on a small machine.
"""

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

KEYS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPUPOOL_API_URL", "GPUPOOL_ALLOCATION",
        "GPUPOOL_NODE", "GPUPOOL_PROFILE", "JUPYTERHUB_USER", "JUPYTERHUB_SERVER_NAME", "CPU_LIMIT", "MEM_LIMIT")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"pid": os.getpid(), "path": self.path,
                           "env": {k: os.environ[k] for k in KEYS if k in os.environ}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    server = ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 8888), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
