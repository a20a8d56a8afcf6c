"""One agent per node: the node's lease, held by the agent process that calls.

Two agents speaking for one node (a second one started by hand, an old one
that hung through a restart, a copied config on another host) would both
report the node and both stop processes: inventories flap, and a user's
process can be signalled twice. Every agent call carries the process's
instance (``X-GPUPool-Agent-Instance``: host, PID and a random part). The
first instance to call holds the node; another one is refused with 409 while
the holder has called within ``agent_timeout`` seconds, and the refused agent
exits naming the holder. An agent gives the lease up when it stops, so a
restart (or a new agent that took the metrics port over) is served at once;
an agent that died silently is replaced after ``agent_timeout``.

Kept in memory: after a service restart the first agent to call holds its
node again. Calls without an instance (agents older than this rule, an
admin's calls) take no lease and are refused none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from ...timefmt import iso

# The wire rule, shared with the agent (gpupool_hub/agent/app.py), which imports it from
# here: this module imports nothing heavy.
#: the request header that names the calling agent process
INSTANCE_HEADER = "X-GPUPool-Agent-Instance"
#: the words of a 409 that mean "another agent holds this node" (other 409s mean other things)
CONFLICT_MARK = "is served by another agent"
#: at most this long, printable ASCII: it is echoed in messages and logs
MAX_INSTANCE_LENGTH = 200


class AgentConflict(Exception):
    """Another agent process holds the node."""


@dataclass
class Holder:
    instance: str
    since: datetime
    last_call: datetime


class AgentLeases:
    """Per node, the agent instance that speaks for it."""

    def __init__(self, timeout: float, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.timeout = timeout
        self.clock = clock
        self._holders: dict[str, Holder] = {}
        self._lock = threading.Lock()  # handlers call from the event loop, tests from threads

    @staticmethod
    def valid_instance(instance: str) -> bool:
        return 0 < len(instance) <= MAX_INSTANCE_LENGTH and instance.isprintable() and instance.isascii()

    def claim(self, node: str, instance: str) -> Holder:
        """Note a call of ``instance`` for ``node``; :class:`AgentConflict` when another live one holds it."""
        now = self.clock()
        with self._lock:
            held = self._holders.get(node)
            if held is not None and held.instance != instance:
                silent = (now - held.last_call).total_seconds()
                if silent < self.timeout:
                    raise AgentConflict(
                        f"node {node!r} {CONFLICT_MARK} ({held.instance}, since {iso(held.since)}, "
                        f"last call {silent:.0f} s ago); stop one of them. This one is refused until that one "
                        f"stops or stays silent for {self.timeout:.0f} s")
                held = None
            if held is None:
                held = self._holders[node] = Holder(instance, now, now)
            held.last_call = now
            return held

    def release(self, node: str, instance: str) -> bool:
        """The holder stops: the node is free at once. False when ``instance`` did not hold it."""
        with self._lock:
            held = self._holders.get(node)
            if held is None or held.instance != instance:
                return False
            del self._holders[node]
            return True

    def holder(self, node: str) -> Holder | None:
        with self._lock:
            return self._holders.get(node)
