"""The documentation site builds, lists every page, and documents every setting.

- ``mkdocs build --strict`` succeeds (broken links, bad anchors and pages left
  out of the nav are errors in strict mode with the validation in mkdocs.yml);
- every Markdown page under docs/ is in the nav of mkdocs.yml;
- docs/configuration.md names every configurable trait of GPUPool,
  GPUPoolService, Culler and GPUPoolSpawner, so a new setting without
  documentation fails here (regenerate with docs/gen_config_reference.py).

Skips when mkdocs is not installed; CI (GPUPOOL_REQUIRE_INTEGRATION=1) turns
that skip into a failure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _nav_pages(nav) -> set[str]:
    pages: set[str] = set()
    if isinstance(nav, str):
        pages.add(nav)
    elif isinstance(nav, list):
        for item in nav:
            pages |= _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            pages |= _nav_pages(value)
    return pages


def _mkdocs_config() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs) is needed to read mkdocs.yml")
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs not installed (pip install -e '.[test]')")
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (site / "index.html").is_file()
    assert (site / "configuration" / "index.html").is_file()
    # the OpenAPI file is published next to the API reference, and the endpoint table was generated
    assert (site / "openapi.json").read_bytes() == (ROOT / "gpupool_hub/service/openapi.json").read_bytes()
    reference = (site / "api-reference" / "index.html").read_text(encoding="utf-8")
    assert "/users/{name}/grant" in reference and "openapi-endpoints" not in reference


def test_every_page_is_in_the_nav() -> None:
    config = _mkdocs_config()
    in_nav = _nav_pages(config["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - in_nav == set(), f"pages missing from the nav in mkdocs.yml: {sorted(pages - in_nav)}"
    assert in_nav - pages == set(), f"nav entries without a page: {sorted(in_nav - pages)}"


def _configurables():
    from gpupool_hub.config import GPUPool
    from gpupool_hub.service.app import GPUPoolService
    from gpupool_hub.takeback.cull import Culler
    from gpupool_hub.spawner import GPUPoolSpawner

    return [GPUPool, GPUPoolService, Culler, GPUPoolSpawner]


@pytest.mark.parametrize("cls", _configurables(), ids=lambda c: c.__name__)
def test_configuration_reference_names_every_trait(cls) -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    traits = sorted(cls.class_own_traits(config=True))
    assert traits, f"{cls.__name__} has no configurable traits?"
    missing = [f"c.{cls.__name__}.{name}" for name in traits
               if not re.search(rf"c\.{cls.__name__}\.{name}\b", text)]
    assert not missing, (
        f"docs/configuration.md does not document {missing}; "
        "run: .venv/bin/python docs/gen_config_reference.py"
    )
