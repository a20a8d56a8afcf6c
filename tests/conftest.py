"""Suite-wide fixtures, the "nothing skips in CI" rule, and what may run in parallel.

Integration tests skip when a system binary or server is missing on a
developer's machine. CI sets ``GPUPOOL_REQUIRE_INTEGRATION=1``; then every
skip is reported as a failure, so a missing install step cannot hide behind
a green run.

``scripts/test.sh`` runs the suite on several pytest-xdist workers
(``--dist loadgroup``). A module's tests stay together on one worker, so a
module's hub starts once. Tests that share something machine-wide stay on one
worker too, through :data:`SHARED`: the session's Slurm cluster (slurmctld,
slurmd, slurmdbd and MariaDB are one set of daemons) and the agent tests'
fixed Unix accounts (created once, and every process of theirs killed when the
session ends). Those groups are scheduled first, as they are the longest.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.fixtures.processes", "tests.fixtures.postgres", "tests.fixtures.hub", "tests.fixtures.prometheus", "tests.fixtures.slurm"]
pytest_plugins += ["tests.load"]  # GPUPOOL_TEST_LOAD: busy CPUs beside the tests marked `loaded`

REQUIRE_INTEGRATION = os.environ.get("GPUPOOL_REQUIRE_INTEGRATION", "") not in ("", "0")

#: xdist group -> the session fixture whose users all run on one worker
SHARED = {"slurm-cluster": "slurm_cluster", "agent-unix-users": "test_users"}


def shared_group(item: pytest.Item) -> str | None:
    names = getattr(item, "fixturenames", ())
    return next((group for group, fixture in SHARED.items() if fixture in names), None)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(shared_group(item) or item.nodeid.split("::", 1)[0]))
    if hasattr(config, "workerinput"):  # an xdist worker
        # the long groups first, so no worker idles at the end while one works through them
        items.sort(key=lambda item: shared_group(item) is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # `gpu` tests need a real NVIDIA GPU, which CI does not have: they skip there, and that is no failure
    if (REQUIRE_INTEGRATION and report.skipped and not hasattr(report, "wasxfail")
            and item.get_closest_marker("gpu") is None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"skipped, but GPUPOOL_REQUIRE_INTEGRATION=1 forbids skips: {reason}"
        )
