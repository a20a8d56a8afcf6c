"""``python -m gpupool_hub.agent``: configuration, help, and the one-shot report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from traitlets import TraitError

from gpupool_hub.agent.app import GPUPoolAgent


def test_help_documents_the_settings():
    out = subprocess.run([sys.executable, "-m", "gpupool_hub.agent", "--help-all"], capture_output=True, text=True,
                         timeout=60).stdout
    for trait in ("service_url", "token", "node_name", "metrics_port", "interval", "dry_run", "min_uid", "grace"):
        assert f"--GPUPoolAgent.{trait}=" in out
    assert "GPUPOOL_AGENT_TOKEN" in out


def test_config_file_env_token_and_command_line(tmp_path, monkeypatch, make_nvml):
    cfg = tmp_path / "agent_config.py"
    cfg.write_text("c.GPUPoolAgent.node_name = 'gpu-07'\nc.GPUPoolAgent.min_uid = 2000\n"
                   "c.GPUPoolAgent.service_url = 'http://hub:10101/services/gpupool/'\n")
    monkeypatch.setenv("GPUPOOL_AGENT_TOKEN", "from-env")
    agent = GPUPoolAgent(nvml=make_nvml([]))
    agent.initialize(["--config", str(cfg), "--min-uid=1500", "--dry-run"])
    assert (agent.node_name, agent.min_uid, agent.dry_run, agent.token) == ("gpu-07", 1500, True, "from-env")
    assert agent.client.api == "http://hub:10101/services/gpupool/api/v1/nodes/gpu-07"
    assert agent.enforcer.min_uid == 1500 and agent.enforcer.dry_run


def test_root_cannot_be_configured_into_enforcement():
    with pytest.raises(TraitError):
        GPUPoolAgent(min_uid=0)


def test_once_prints_a_report_and_fails_clearly_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "gpupool_hub.agent", "--once"], capture_output=True, text=True,
                          timeout=120)
    report = json.loads(proc.stdout)
    if report["nvml_ok"]:  # a machine with a GPU
        assert proc.returncode == 0 and report["inventory"]["gpus"]
    else:
        assert proc.returncode == 1 and report["nvml_error"]
        assert "GPU discovery failed" in proc.stderr
