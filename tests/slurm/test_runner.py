"""The Slurm engine's one process runner (``commands.run_slurm``, issue 49.2): the readers and the
spawner's submit, query and cancel all run through it. Real processes, no Slurm needed: what a
command sees of its environment and its input."""

from __future__ import annotations

import os

import pytest

from gpupool_hub.engines.slurm.commands import FORCED_ENV, SlurmCommandError, run_slurm


def _env_of(**kwargs: object) -> dict[str, str]:
    out = run_slurm(["env"], env={"PATH": os.environ["PATH"], "TZ": "Europe/Berlin", "LC_ALL": "de_DE.UTF-8"},
                    **kwargs)  # type: ignore[arg-type]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_a_reader_runs_with_the_forced_zone_and_locale():
    seen = _env_of()
    assert {k: seen[k] for k in FORCED_ENV} == FORCED_ENV


def test_a_submit_hands_the_servers_environment_to_the_job_as_it_is():
    seen = _env_of(job_env=True, input="")
    assert seen["TZ"] == "Europe/Berlin" and seen["LC_ALL"] == "de_DE.UTF-8"
    assert "SLURM_TIME_FORMAT" not in seen


def test_the_batch_script_goes_to_standard_input():
    script = "#!/bin/bash\n#SBATCH --gres=gpu:a6000:1\nexec jupyterhub-singleuser\n"
    assert run_slurm(["cat"], input=script, job_env=True) == script


def test_a_failure_carries_its_stderr_and_a_missing_command_says_what_to_install():
    with pytest.raises(SlurmCommandError) as e:
        run_slurm(["sh", "-c", "echo 'sbatch: error: Batch job submission failed' >&2; exit 1"])
    assert e.value.returncode == 1 and e.value.stderr == "sbatch: error: Batch job submission failed"
    with pytest.raises(SlurmCommandError, match="slurm-client"):
        run_slurm(["no-such-slurm-client-here"])
