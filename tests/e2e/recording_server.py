"""A single-user "server" that records every credential it is sent, as a user's code could.

Started by the hub's spawner in place of ``jupyterhub-singleuser`` (standard
library only). It answers the hub's readiness check and the parts of Jupyter
Server's kernels API the cull uses: ``GET …/api/kernels`` lists one kernel,
``DELETE …/api/kernels/<id>`` shuts it down. For every request that carries a
token (``Authorization`` header or ``?token=``), it asks the hub at once, while
the token is still valid, whom it belongs to and which scopes it has
(``GET /hub/api/user``, as any user's code could), and appends what it saw to
``credentials.jsonl`` in its working directory (the user's home).

``GET …/api/kernels`` answers only once ``release`` exists in that directory
(at most 60 s): the test reads the token's expiry at the hub meanwhile.
"""

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

KERNEL = {"id": "0b1d-kernel", "name": "python3", "execution_state": "idle", "connections": 0}


def whoami(token):
    req = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"].rstrip("/") + "/user",
                                 headers={"Authorization": "token " + token})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"rejected": e.code}


class Handler(BaseHTTPRequestHandler):
    def _record(self):
        header = self.headers.get("Authorization", "")
        query = parse_qs(urlparse(self.path).query).get("token", [])
        tokens = [t for t in [header.partition(" ")[2].strip()] + query if t]
        for token in tokens:
            entry = {"method": self.command, "path": urlparse(self.path).path, "token": token,
                     "own": token == os.environ.get("JUPYTERHUB_API_TOKEN"), "whoami": whoami(token)}
            with open("credentials.jsonl", "a") as f:
                f.write(json.dumps(entry) + "\n")

    def _answer(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self._record()
        if urlparse(self.path).path.endswith("/api/kernels"):
            deadline = time.monotonic() + 60
            while not os.path.exists("release") and time.monotonic() < deadline:
                time.sleep(0.05)
            self._answer(200, [KERNEL])
        else:
            self._answer(200, {"pid": os.getpid()})

    def do_DELETE(self):  # noqa: N802
        self._record()
        self._answer(204)

    def do_POST(self):  # noqa: N802
        self._record()
        self._answer(404, {"message": "not here"})

    def log_message(self, *args):
        pass


def main():
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    server = ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 8888), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
