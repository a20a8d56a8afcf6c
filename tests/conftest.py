"""Suite-wide fixtures and the "nothing skips in CI" rule.

Integration tests skip when a system binary or server is missing on a
developer's machine. CI sets ``GPUPOOL_REQUIRE_INTEGRATION=1``; then every
skip is reported as a failure, so a missing install step cannot hide behind
a green run.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.fixtures.processes", "tests.fixtures.postgres", "tests.fixtures.hub", "tests.fixtures.prometheus", "tests.fixtures.slurm"]
pytest_plugins += ["tests.load"]  # GPUPOOL_TEST_LOAD: busy CPUs beside the tests marked `loaded`

REQUIRE_INTEGRATION = os.environ.get("GPUPOOL_REQUIRE_INTEGRATION", "") not in ("", "0")


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
