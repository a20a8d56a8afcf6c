"""``c.GPUPool.db_url_file`` (issue 27.4): the ledger's URL, with its password, comes
from a file only the service's user can read, not from the service's environment
(which the hub stores in its own database). The real service process refuses a file
others may read and starts from a private one; the example configuration passes no
secret in ``environment``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from gpupool_hub.config import GPUPool
from gpupool_hub.ledger import Ledger
from gpupool_hub.service.configfile import DbUrlFileError, ledger_url
from tests.agent.test_report_limits import ServiceProcess

REPO = Path(__file__).resolve().parents[2]


def _url_file(tmp_path: Path, url: str, mode: int) -> Path:
    path = tmp_path / "gpupool-db-url"
    path.write_text(url + "\n")
    path.chmod(mode)
    return path


def test_the_url_is_read_from_a_private_file(tmp_path):
    db = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    path = _url_file(tmp_path, db, 0o600)
    assert ledger_url(GPUPool(db_url_file=str(path))) == db
    assert ledger_url(GPUPool(db_url="sqlite:///other.sqlite")) == "sqlite:///other.sqlite"  # no file: db_url


@pytest.mark.parametrize("mode, content, message", [
    (0o644, "postgresql://u:pw@db/x", "may be read by group or others (mode 0644)"),
    (0o640, "postgresql://u:pw@db/x", "may be read by group or others (mode 0640)"),
    (0o600, "", "must hold the database URL on one line, found 0 lines"),
    (0o600, "postgresql://a\npostgresql://b", "found 2 lines"),
])
def test_a_readable_or_malformed_file_is_refused(tmp_path, mode, content, message):
    path = tmp_path / "gpupool-db-url"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(DbUrlFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ledger_url(GPUPool(db_url_file=str(path)))
    with pytest.raises(DbUrlFileError, match="cannot be read: No such file"):
        ledger_url(GPUPool(db_url_file=str(tmp_path / "missing")))


def test_the_service_refuses_a_readable_file_and_starts_from_a_private_one(tmp_path):
    db = f"sqlite:///{tmp_path / 'from-file.sqlite'}"
    path = _url_file(tmp_path, db, 0o644)
    service = ServiceProcess(tmp_path, extra_config=f"c.GPUPool.db_url_file = {str(path)!r}\n",
                             db_url=f"sqlite:///{tmp_path / 'not-this.sqlite'}")
    refused = subprocess.run([sys.executable, "-m", "gpupool_hub.service", "--config", str(service.config)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "chmod 600" in refused.stderr and "may be read by group or others" in refused.stderr, refused.stderr
    path.chmod(0o600)
    service.start()
    try:
        r = requests.put(service.url + "nodes/n1/inventory", headers=service.auth("n1"), timeout=10,
                         json={"cpu_milli": 1000, "memory_mib": 1024, "gpus": {"count": 1, "model": "A100"}})
        assert r.status_code == 200, r.text
    finally:
        service.stop()
    ledger = Ledger(db)  # the service used the file's database (it remembered n1's GPU there)
    try:
        assert ledger.nodes.devices() == {"n1/gpu0": "n1"}
    finally:
        ledger.close()
    assert not (tmp_path / "not-this.sqlite").exists()


def test_the_example_config_passes_no_secret_in_the_services_environment():
    tree = ast.parse((REPO / "jupyterhub_config.example.py").read_text())
    environments = [node.values[node.keys.index(key)] for node in ast.walk(tree) if isinstance(node, ast.Dict)
                    for key in node.keys if isinstance(key, ast.Constant) and key.value == "environment"]
    assert environments, "the example has a service entry with an environment"
    for env in environments:
        assert ast.unparse(env) == "{}", ast.unparse(env)
    assert "GPUPOOL_DB_URL" not in (REPO / "jupyterhub_config.example.py").read_text()
