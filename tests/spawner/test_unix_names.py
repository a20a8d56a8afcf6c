"""Issue 37.1: a hub user name becomes a Unix account, a command argument or a unit name only if it is a
login name with an account; else the spawn is refused with 403 naming the rule, before the pool is asked.

The spawners run their real ``start`` (the mixin, then the wrapped spawner) against the real service
(in-process, SQLite). ``gpupool-systemd`` runs stand-ins for ``systemd-run`` / ``systemctl`` that record
their argv (tests/spawner/test_systemd_units.py); ``gpupool-localprocess`` starts a real process whose
command writes a file, so "nothing ran" is a file that is not there. The accounts are real: the
machine's own system accounts (refused), and ordinary ones made for the test (``unix_account``).
"""

from __future__ import annotations

import os
import pwd
import secrets
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpupool_hub.spawner.errors import GPUPoolRefused, SpawnFailure
from gpupool_hub.engines.local.spawner import GPUPoolLocalProcessSpawner
from gpupool_hub.identity.unix import RULE
from tests.agent.test_service import Service
from tests.e2e.conftest import shared_dir, system_python  # noqa: F401 (fixture)
from tests.fixtures.hub import wait_for
from tests.fixtures.unix_accounts import unix_account  # noqa: F401 (fixture)

#: names that are no login name: uids for sudo/runuser, an option, words, a path step, systemd's uid
NOT_LOGIN_NAMES = ["#0", "#1001", "-u", "alice bob", "x -u root", "o'neil", "..", "1001", "a/b", "x" * 33]
PROFILES = [{"slug": "cpu", "display_name": "CPU", "default": True},
            {"slug": "gpu", "display_name": "1 GPU", "gpus": 1}]
HUB = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="http://127.0.0.1:8081/hub/",
                      public_host="", host="")


def no_account() -> str:
    """A good login name that ``pwd`` does not know."""
    while True:
        name = f"noacct{secrets.token_hex(3)}"
        try:
            pwd.getpwnam(name)
        except KeyError:
            return name


def config(svc: Service) -> Config:
    c = Config()
    c.GPUPoolSpawner.profiles = PROFILES
    c.GPUPoolSpawner.gpupool_api_url = svc.url + "api/v1"
    c.GPUPoolSpawner.gpupool_api_token = "admin-token"
    c.Spawner.start_timeout = 10
    return c


def hub_user(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, groups=[], url=f"/user/{name}/", escaped_name=name, id=7)


def ever_allocated(svc: Service) -> list:
    """Every allocation the service ever recorded, released ones too."""
    return svc.manager.ledger.allocations.overlapping(datetime(2000, 1, 1, tzinfo=timezone.utc),
                                                      datetime(2100, 1, 1, tzinfo=timezone.utc))


async def refused(spawner) -> GPUPoolRefused:
    spawner.user_options = {"profile": "gpu"}
    with pytest.raises(GPUPoolRefused) as e:
        await spawner.start()
    assert e.value.status_code == 403 and e.value.reason == SpawnFailure.UNIX_NAME, e.value
    assert RULE in e.value.message and repr(spawner.user.name) in e.value.message, e.value.message
    return e.value


# --------------------------------------------------------- gpupool-localprocess


def local_spawner(svc: Service, name: str, marker: Path) -> GPUPoolLocalProcessSpawner:
    c = config(svc)
    # a Python every account may run (the test runner's may sit in root's home): servers run as their users
    c.Spawner.cmd = [system_python(), "-c", f"open({str(marker)!r}, 'w').close(); import time; time.sleep(60)"]
    c.GPUPoolLocalProcessSpawner.server_record_dir = str(marker.parent / "servers")  # not the host's
    return GPUPoolLocalProcessSpawner(user=hub_user(name), hub=HUB, config=c)


@pytest.mark.parametrize("name", NOT_LOGIN_NAMES + ["no account"])
async def test_localprocess_refuses_a_name_that_is_no_account_before_asking_the_pool(tmp_path, name):
    svc = Service(tmp_path)
    try:
        name = no_account() if name == "no account" else name
        marker = tmp_path / "server-ran"
        spawner = local_spawner(svc, name, marker)
        await refused(spawner)
        assert spawner.pid == 0 and not marker.exists()
        assert ever_allocated(svc) == [] and svc.manager.ledger.history(name) == []
    finally:
        svc.stop()


@pytest.mark.parametrize("name", ["root", "daemon", "nobody", "www-data"])
async def test_localprocess_refuses_root_and_system_accounts(tmp_path, name):
    """Issue 48.1: a system account is a login name with an account (locally a server of ``postgres`` ran
    as uid 101); it gets 403 naming why, before the pool is asked: nothing runs, is held or charged."""
    svc = Service(tmp_path)
    try:
        marker = tmp_path / "server-ran"
        spawner = local_spawner(svc, name, marker)
        spawner.user_options = {"profile": "gpu"}
        with pytest.raises(GPUPoolRefused) as e:
            await spawner.start()
        assert e.value.status_code == 403 and e.value.reason == SpawnFailure.UNIX_NAME, e.value
        assert "never as root, a system account" in e.value.message, e.value.message
        assert spawner.pid == 0 and not marker.exists()
        assert ever_allocated(svc) == [] and svc.manager.ledger.history(name) == []
    finally:
        svc.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="a server of another account needs root")
async def test_localprocess_runs_a_real_account_with_its_gpus(tmp_path, unix_account, shared_dir):
    svc = Service(tmp_path)
    try:
        name = unix_account("local")  # an ordinary account: the runner's own (root) is refused (issue 48.1)
        shared_dir.chmod(0o1777)  # the server, running as that account, writes its marker here
        marker = shared_dir / "server-ran"
        spawner = local_spawner(svc, name, marker)
        spawner.user_options = {"profile": "gpu"}
        await spawner.start()
        try:
            [alloc] = ever_allocated(svc)
            assert alloc.user == name and alloc.released_at is None
            wait_for(marker.exists, 30, "the server process to run")
        finally:
            await spawner.stop(now=True)
    finally:
        svc.stop()
