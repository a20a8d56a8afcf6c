"""Who may read the agent's ``/metrics``: where it listens, and the token a scrape must bring.

The series name every user of the node with their GPUs, memory and processes, so they are
not for whoever can open a connection to the node, and that includes the node itself:
users' servers and kernels run there, and a scrape of 127.0.0.1 by ``nobody`` read alice's
and bob's GPU use (issue 48.5). So a scrape must bring ``Authorization: Bearer <token>``
(Prometheus' ``authorization: {credentials_file: …}``), the token read from
``metrics_token_file``; anything else gets 401. By default the endpoint listens on 127.0.0.1
only. Without a token file the agent does not start, with a message naming both ways out:
a token, or ``metrics_without_token`` — an explicit choice, for a loopback address only, on
nodes where no user runs code. An address other machines can reach always needs the token.
A warning would leave every user's usage open in a log nobody reads, and the setting would be
copied from node to node with the hole in it.

The token is compared in constant time (of equal-length digests), and the file holding it
must be the agent's alone: readable by group or others, the token is anybody's.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from ..lifetime import bind_or_take_over
from ..identity.secretfile import read_secret_line

__all__ = ["MetricsAccessError", "is_loopback", "metrics_token", "open_endpoint", "read_token", "serve"]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class MetricsAccessError(RuntimeError):
    """The metrics endpoint cannot be opened safely as configured; the message says what to do."""


def is_loopback(address: str) -> bool:
    """Whether only this machine can connect to ``address`` (an IP or a host name)."""
    if not address:
        return False  # every interface
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def read_token(path: str) -> bytes:
    """The token in ``path`` (one line, surrounding white space ignored, as Prometheus does with
    its ``credentials_file``). Refuses a file group or others may read, and an empty one."""
    return read_secret_line(path, where=f"c.GPUPoolAgent.metrics_token_file {path!r}", what="the token",
                            holds="the token to every user's GPU use", error=MetricsAccessError).encode()


def metrics_token(address: str, token_file: str, without_token: bool = False) -> bytes | None:
    """The token scrapes must bring; ``None`` only where the admin chose ``without_token`` and only this
    machine can connect."""
    if token_file:
        return read_token(token_file)
    if not is_loopback(address):
        raise MetricsAccessError(
            f"c.GPUPoolAgent.metrics_address {address!r} can be reached from other machines, and "
            "c.GPUPoolAgent.metrics_token_file is not set: anyone who reaches the port would read every user's "
            "GPU use. Set metrics_token_file to a file holding a token (the scrape job's "
            "authorization.credentials_file holds the same), or listen on 127.0.0.1 (see docs/agent.md)")
    if without_token:
        return None
    raise MetricsAccessError(
        "c.GPUPoolAgent.metrics_token_file is not set: every process on this node, users' servers and kernels "
        f"included, could read every user's GPU use on {address}. Set metrics_token_file to a file (mode 600) "
        "holding a token, which the scrape job's authorization.credentials_file holds too; or, on a node where "
        "no user runs code, set c.GPUPoolAgent.metrics_without_token = True (see docs/agent.md, 'Who may read "
        "/metrics')")


def require_bearer(app: WSGIApp, token: bytes) -> WSGIApp:
    """``app`` for requests with ``Authorization: Bearer <token>``; 401 for any other."""
    expected = hashlib.sha256(token).digest()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
        # WSGI hands headers over as latin-1 text: encoding it back gives the bytes sent
        digest = hashlib.sha256(given.strip().encode("latin-1", "replace")).digest()
        if hmac.compare_digest(digest, expected) and scheme.lower() == "bearer":
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", 'Bearer realm="gpupool-agent"')])
        return [b"401: this endpoint needs Authorization: Bearer <c.GPUPoolAgent.metrics_token_file's token>\n"]

    return guarded


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck scrape never holds the agent's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """One line per scrape would drown the agent's own log."""


def serve(registry: CollectorRegistry, port: int, address: str, token: bytes | None) -> WSGIServer:
    """Serve ``registry`` in a daemon thread (scrapes are answered while a tick is busy), behind the
    token when there is one. ``.server_port`` is the bound port; ``.shutdown()`` stops it."""
    family, _, _, _, sockaddr = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    server_class = type("MetricsServer", (_Server,), {"address_family": family})
    app: WSGIApp = make_wsgi_app(registry)
    if token is not None:
        app = require_bearer(app, token)
    httpd = make_server(str(sockaddr[0]), port, app, server_class, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="gpupool-agent-metrics", daemon=True).start()
    return httpd


def open_endpoint(registry: CollectorRegistry, port: int, address: str, token_file: str,
                  without_token: bool = False) -> WSGIServer:
    """The agent's ``/metrics``: behind its token (unless ``without_token`` on a loopback address),
    on a port taken over from an older agent of this node if one holds it. Exits with a message
    naming the setting when it cannot be opened safely."""
    try:
        token = metrics_token(address, token_file, without_token)
    except MetricsAccessError as e:
        raise SystemExit(f"gpupool-agent: {e}") from None
    return bind_or_take_over(
        lambda: serve(registry, port, address, token), port, f"{port} on {address}", _is_gpupool_agent,
        program="gpupool-agent", older="an older gpupool agent",
        advice="stop it or choose another port (c.GPUPoolAgent.metrics_port, --port)")


def _is_gpupool_agent(proc: Any) -> bool:
    """``proc`` (psutil) is a gpupool node agent (``python -m gpupool_hub.agent`` or ``gpupool-agent``)."""
    try:
        cmd = proc.cmdline()
    except Exception:
        return False
    return any(part in ("gpupool_hub.agent", "gpupool_hub.agent.app") or part.endswith("/gpupool-agent")
               or part == "gpupool-agent" for part in cmd)
