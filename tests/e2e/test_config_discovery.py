"""Item 18.9: a configuration that ``load_subconfig``s the example is the one the service reads.

The trap: the example passed its own path (``__file__``) to the service, so a
hub whose ``jupyterhub_config.py`` loaded the example and then changed
settings ran a service that read only the example, silently. The e2e wrapper
(``ExampleHub``) is exactly such a file, and nothing tells the service which
file to read (no ``GPUPOOL_CONFIG_FILE``): a setting made after the
``load_subconfig`` must reach the service.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest

from tests.spawner.conftest import service_pid

pytestmark = pytest.mark.integration

AFTER = """
# set after load_subconfig: only in this file, not in the example
c.GPUPool.initial_grant = 7
"""


def test_18_9_the_service_reads_the_hubs_file_not_the_example_it_loads(example_hub_factory, monkeypatch):
    monkeypatch.delenv("GPUPOOL_CONFIG_FILE", raising=False)
    hub = example_hub_factory(extra=AFTER)
    assert "GPUPOOL_CONFIG_FILE" not in hub.env
    cmdline = Path(f"/proc/{service_pid(hub)}/cmdline").read_bytes().split(b"\0")
    assert os.fsencode(hub.config_path) in cmdline, cmdline  # the hub's -f, not the example
    hub.create_user("carol")
    r = hub.service("GET", "/users/carol", hub.spawner_token)
    assert r.status_code == 200, r.text
    assert Decimal(r.json()["balance"]) == 7  # the example says 100
    assert "gpupool: configuration from " + str(hub.config_path) in hub.log_tail(400)
