"""Suite-wide fixtures, the "nothing skips in CI" rule, and what may run in parallel.

Integration tests skip when a system binary or server is missing on a
developer's machine. CI sets ``GPUPOOL_REQUIRE_INTEGRATION=1``; then every
skip is reported as a failure, so a missing install step cannot hide behind
a green run. Two markers are exempt, as no install step can give CI what they
need: ``gpu`` (a real NVIDIA GPU) and ``systemd_pid1`` (systemd as PID 1, for a
real transient unit; starting a second systemd is no option). Their skips stay
skips, each reported with its reason (``-rs``).

``scripts/test.sh`` runs the suite on several pytest-xdist workers. A
module's tests stay together on one worker, so a module's hub starts once.
Tests that share something machine-wide stay on one worker too, through
:data:`SHARED`: the session's Slurm cluster (slurmctld, slurmd, slurmdbd and
MariaDB are one set of daemons) and the agent tests' fixed Unix accounts
(created once, and every process of theirs killed when the session ends).
Those groups are scheduled first, as they are the longest.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.fixtures.processes", "tests.fixtures.postgres", "tests.fixtures.hub", "tests.fixtures.prometheus", "tests.fixtures.slurm"]
pytest_plugins += ["tests.load"]  # GPUPOOL_TEST_LOAD: busy CPUs beside the tests marked `loaded`

REQUIRE_INTEGRATION = os.environ.get("GPUPOOL_REQUIRE_INTEGRATION", "") not in ("", "0")
#: markers whose skips stay skips under GPUPOOL_REQUIRE_INTEGRATION (what they need, CI cannot have)
EXEMPT_FROM_REQUIRE = ("gpu", "systemd_pid1")

#: work that shares something machine-wide, by test path: it all runs on one xdist worker
SHARED = {
    "slurm-cluster": ("tests/slurm/",),  # the session's one Slurm cluster
    "agent-unix-users": ("tests/agent/", "tests/e2e/test_no_borrowed_tokens.py"),  # fixed Unix accounts
}


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to on xdist: its shared group, else its module."""
    path = nodeid.split("::", 1)[0]
    return next((group for group, prefixes in SHARED.items() if path.startswith(prefixes)), path)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Whole units of work (:func:`scope_of`) to each worker, the shared groups first.

    xdist's own ``--dist loadgroup`` reads ``xdist_group`` marks into the test ids,
    which does not take with this pytest (tests of one module went to both workers,
    each starting the module's hub), so the units are made here from the test ids."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return Units(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the long shared groups first, so no
        # worker idles at the end while the other works through one of them
        items.sort(key=lambda item: scope_of(item.nodeid) not in SHARED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # `gpu` tests need a real NVIDIA GPU, `systemd_pid1` tests systemd as PID 1; CI has neither:
    # they skip there, and that is no failure
    if (REQUIRE_INTEGRATION and report.skipped and not hasattr(report, "wasxfail")
            and not any(item.get_closest_marker(m) for m in EXEMPT_FROM_REQUIRE)):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"skipped, but GPUPOOL_REQUIRE_INTEGRATION=1 forbids skips: {reason}"
        )
