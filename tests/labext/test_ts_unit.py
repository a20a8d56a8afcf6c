"""Run the TypeScript unit tests (vitest, labextension/test/) from pytest, so
that `scripts/test.sh` and CI run them too. `pip install -e .` has run
`npm install` in labextension/ when it built the extension."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

LABEXTENSION = Path(__file__).parents[2] / "labextension"

pytestmark = pytest.mark.integration


def test_vitest_unit_tests():
    npm = shutil.which("npm")
    if not npm:
        pytest.skip("npm not found (apt-get install nodejs npm)")
    if not (LABEXTENSION / "node_modules" / "vitest").is_dir():
        pytest.fail("labextension/node_modules is missing: run `npm install` in labextension/ "
                    "(or `pip install -e .`, which does it when it builds the extension)")
    run = subprocess.run([npm, "test", "--silent", "--", "--reporter=dot"], cwd=LABEXTENSION,
                         capture_output=True, text=True, timeout=300, env=_env())
    assert run.returncode == 0, run.stdout + run.stderr


def test_typescript_compiles_with_the_tests():
    npm = shutil.which("npm")
    if not npm:
        pytest.skip("npm not found (apt-get install nodejs npm)")
    if not (LABEXTENSION / "node_modules" / "typescript").is_dir():
        pytest.fail("labextension/node_modules is missing: run `npm install` in labextension/")
    run = subprocess.run([npm, "run", "--silent", "typecheck"], cwd=LABEXTENSION,
                         capture_output=True, text=True, timeout=300, env=_env())
    assert run.returncode == 0, run.stdout + run.stderr


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("CI", "1")  # vitest: no watch mode, no interactive output
    env["NO_COLOR"] = "1"
    return env
