"""A single-user "server" that tries what a user's code could try against other users.

Started by the hub's spawner like ``jupyterhub-singleuser`` (same Unix user,
same environment, same working directory: the user's home), with the
system Python and the standard library only, so that a freshly created Unix
user can run it. It answers every GET (the hub's readiness check) and:

* at start, writes ``secret.txt`` into its working directory, as any program
  the user runs would (the file's mode comes from the spawner's umask);
* ``GET …/probe?read=PATH&read=PATH&api=METHOD:PATH&…``: tries to read each
  file and to call the gpupool API (``GPUPOOL_API_URL``) with the server's own
  token (``JUPYTERHUB_API_TOKEN``), and answers what happened, as JSON.
"""

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def try_read(path):
    try:
        with open(path, "rb") as f:
            data = f.read(65536)
    except OSError as e:
        return {"ok": False, "error": type(e).__name__}
    return {"ok": True, "bytes": len(data), "has_token": b"JUPYTERHUB_API_TOKEN=" in data}


def try_api(spec):
    method, _, path = spec.partition(":")
    url = os.environ.get("GPUPOOL_API_URL", "").rstrip("/") + path
    req = urllib.request.Request(url, method=method,
                                 headers={"Authorization": "token " + os.environ.get("JUPYTERHUB_API_TOKEN", "")})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return {"status": r.status, "body": r.read(2000).decode("utf8", "replace")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read(2000).decode("utf8", "replace")}
    except OSError as e:
        return {"status": None, "body": str(e)}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        url = urlparse(self.path)
        answer = {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "path": url.path}
        if url.path.endswith("/probe"):
            query = parse_qs(url.query)
            answer["read"] = {p: try_read(p) for p in query.get("read", [])}
            answer["api"] = {s: try_api(s) for s in query.get("api", [])}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    with open("secret.txt", "w") as f:
        f.write("only for " + os.environ.get("JUPYTERHUB_USER", "?") + "\n")
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    server = ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 8888), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
