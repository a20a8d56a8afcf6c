"""The pool's programs live and die cleanly: the service with its hub, and one
process per port (the service's, a node agent's metrics port).

A hub that dies without stopping its managed services (``kill -9``, the OOM
killer, a crash) would leave the gpupool service running with parent PID 1:
still debiting and culling, still holding its port, so that the next hub's
service cannot start. Two mechanisms, both Linux:

- ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends SIGTERM when the
  process that started the service exits;
- a once-a-second check that the parent PID is unchanged, for the cases the
  signal misses (the parent died before the call; a parent thread, not the
  process, ended; a platform without ``prctl``).

SIGTERM and SIGINT stop the service within ``STOP_DEADLINE`` seconds: it stops
accepting requests and starting jobs, gives the jobs lease up, and exits.
Work in flight is one database transaction at a time, so abandoning it loses
nothing: an interval not marked done is charged by the next service. The node
agent stops the same way (``gpupool_hub/agent/app.py``).

The hub's proxy dies with its hub too (``gpupool-proxy``, :func:`proxy_main`, the example
configuration's ``c.ConfigurableHTTPProxy.command``): JupyterHub starts
configurable-http-proxy in a session of its own and stops it in its clean-up, but when a
managed service exits during the hub's start (the gpupool service refusing a bad
configuration or an old ledger schema) JupyterHub 6 calls ``exit(1)`` without that clean-up,
and every refused start left a proxy behind on the hub's port.

A program that finds its port held by an older copy of itself (a service whose
hub is gone, an agent that hung) tells it to stop and takes the port over;
held by anything else, it stops at once with a message naming the process.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psutil
from tornado.ioloop import IOLoop, PeriodicCallback
from tornado.netutil import bind_sockets

log = logging.getLogger("gpupool")
T = TypeVar("T")

#: Seconds from SIGTERM to exit, at most.
STOP_DEADLINE = 5.0
_PR_SET_PDEATHSIG = 1


def _signal_when_parent_exits() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)``; False where it failed or does not exist (logged)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("gpupool: prctl(PR_SET_PDEATHSIG) failed (errno %d); watching the parent instead",
                        ctypes.get_errno())
            return False
    except (OSError, AttributeError):
        log.info("gpupool: no prctl on this platform; watching the parent process instead")
        return False
    return True


#: what ``gpupool-proxy`` runs, unless ``$GPUPOOL_PROXY_COMMAND`` names another
PROXY_COMMAND = "configurable-http-proxy"


def proxy_main(argv: list[str] | None = None) -> None:
    """``gpupool-proxy ARGS``: configurable-http-proxy with ARGS, which the kernel stops (SIGTERM) when
    the hub that started it exits, however it exits. It sets the parent-death signal, which survives
    ``exec``, then becomes the proxy (same PID, so JupyterHub's pid file and its own stop still work).
    Not with ``c.JupyterHub.cleanup_proxy = False``, whose point is a proxy outliving its hub."""
    import shutil
    import sys

    args = sys.argv[1:] if argv is None else argv
    command = os.environ.get("GPUPOOL_PROXY_COMMAND", PROXY_COMMAND)
    found = shutil.which(command)
    if found is None:
        raise SystemExit(f"gpupool-proxy: {command} is not on PATH ({os.environ.get('PATH', '')}); install it "
                         "(npm install -g configurable-http-proxy) or name it in $GPUPOOL_PROXY_COMMAND")
    parent = os.getppid()
    _signal_when_parent_exits()
    if parent <= 1 or os.getppid() != parent:  # the hub is gone already: no proxy for nobody
        raise SystemExit("gpupool-proxy: the hub that started it has exited")
    os.execv(found, [found, *args])


def exit_with_parent(on_parent_exit: Callable[[str], None]) -> PeriodicCallback | None:
    """Arrange for ``on_parent_exit`` (on the IOLoop) once the parent is gone.
    Returns the watch, or None when the service has no parent to follow (PID 1)."""
    parent = os.getppid()
    if parent <= 1:
        return None
    _signal_when_parent_exits()

    def check() -> None:
        if os.getppid() != parent:
            watch.stop()
            on_parent_exit(f"its parent process {parent} (the hub) exited")

    watch = PeriodicCallback(check, 1000)
    watch.start()
    check()  # the parent may have died before prctl took effect
    return watch


def on_stop_signals(stop: Callable[[str], None]) -> None:
    """SIGTERM and SIGINT (the hub stops its services with both) call ``stop`` on the IOLoop,
    with a hard exit after ``STOP_DEADLINE`` should anything hang."""
    loop = IOLoop.current()

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        exit_hard_later(name)
        loop.add_callback_from_signal(stop, name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def exit_hard_later(why: str, program: str = "gpupool") -> None:
    """A stop has begun: should it hang, exit the process ``STOP_DEADLINE`` seconds from now."""
    timer = threading.Timer(STOP_DEADLINE, _hard_exit, (why, program))
    timer.daemon = True
    timer.start()


def _hard_exit(why: str, program: str) -> None:
    log.error("%s: not stopped %.0f s after %s; exiting now", program, STOP_DEADLINE, why)
    logging.shutdown()
    os._exit(1)


def listen_sockets(port: int, address: str, config_file: str) -> list[socket.socket]:
    """Bind the service's port, taking it over from an orphaned gpupool service of the same
    configuration (its hub died)."""
    return bind_or_take_over(lambda: bind_sockets(port, address=address), port, f"{port} on {address}",
                             lambda holder: _orphaned_service_of(holder, config_file),
                             program="gpupool", older="an orphaned gpupool service, whose hub is gone,",
                             advice="stop it or give the service another URL in c.JupyterHub.services")


def bind_or_take_over(bind: Callable[[], T], port: int, where: str, takes_over: Callable[[psutil.Process], bool],
                      *, program: str, older: str, advice: str) -> T:
    """``bind()``; when the port is taken by a process ``takes_over`` accepts, SIGTERM it (SIGKILL
    after ``STOP_DEADLINE`` + 1 s) and bind again; taken by anything else, exit naming the process."""
    try:
        return bind()
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
    holder = listener_of(port)
    if holder is None:
        raise SystemExit(f"{program}: port {where} is in use by a process this user cannot see; {advice}")
    described = f"PID {holder.pid} ({' '.join(_cmdline(holder))[:200]})"
    if not takes_over(holder):
        raise SystemExit(f"{program}: port {where} is in use by {described}; {advice}")
    log.warning("%s: port %d is held by %s %s; stopping it and taking over", program, port, older, described)
    holder.terminate()
    deadline = time.monotonic() + STOP_DEADLINE + 1
    while time.monotonic() < deadline:
        try:
            return bind()
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
        time.sleep(0.1)
    holder.kill()
    time.sleep(0.5)
    return bind()


def listener_of(port: int) -> psutil.Process | None:
    """The process listening on TCP ``port`` (None: nobody, or one this user cannot see)."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
    except psutil.Error:
        return None
    return None


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _orphaned_service_of(proc: psutil.Process, config_file: str) -> bool:
    """A gpupool service reading the same configuration file, whose parent is gone
    (adopted by PID 1 or a subreaper that is not a hub)."""
    cmd = _cmdline(proc)
    if not any("gpupool_hub.service" in part or part.endswith("gpupool-service") for part in cmd):
        return False
    if os.path.abspath(config_file) not in {os.path.abspath(p) for p in cmd if p.endswith(".py")}:
        return False
    try:
        parent = proc.parent()
        return parent is None or parent.pid == 1 or "jupyterhub" not in " ".join(_cmdline(parent))
    except psutil.Error:
        return False
