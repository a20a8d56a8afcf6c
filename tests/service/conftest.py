"""One real hub + gpupool service shared by the API modules (test_api*.py).

Starting a hub takes seconds, so the API tests, the issue-12 regressions and
the schema fuzzer share one, with the users and tokens every role needs.
Modules with other configurations (jobs, culling) start their own.
"""

from __future__ import annotations

import secrets

import pytest

#: a user whose name needs quoting in a URL (and JSON, and CSV)
ODD = "o'brien@lab.ü"
#: node agents' tokens: the pool's node-a, and a node whose name needs quoting
AGENT_NODES = {"node-a": secrets.token_hex(8), "rack 1+2/%41": secrets.token_hex(8)}


@pytest.fixture(scope="package")
def api_hub(tmp_path_factory):
    from tests.fixtures.hub import Hub, require_hub_binaries

    require_hub_binaries()
    # the wait queue off: test_api.py checks the refusals of a full pool (no_capacity, "Free now");
    # the queue's own answers are tests/service/test_queue.py's and tests/spawner/test_queue_hub.py's
    hub = Hub(tmp_path_factory.mktemp("hub"), extra_config=f"c.GPUPoolService.agent_tokens = {AGENT_NODES!r}\n"
              "c.GPUPool.queue_enabled = False\n")
    hub.start()
    for name in ("alice", "bob", "admin", "carol", ODD):
        hub.create_user(name)
    hub.tokens = {
        "alice": hub.token_for("alice"),
        "bob": hub.token_for("bob"),
        "admin": hub.token_for("admin"),
        "spawner": hub.spawner_token,
        "none": None,
        "bogus": "not-a-token",
        "noaccess": hub.token_for("carol", scopes=["read:users!user=carol"]),
        "odd": hub.token_for(ODD),
    }
    hub.agent_tokens = dict(AGENT_NODES)
    yield hub
    hub.stop()
