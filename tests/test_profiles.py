"""gpupool_hub.profiles on its own: no JupyterHub needed, and user options checked as plain values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool_hub.profiles import InvalidOptions, choose_profile, parse_profiles

ROOT = Path(__file__).resolve().parent.parent

PROFILES = parse_profiles([
    {"slug": "cpu", "display_name": "CPU", "default": True},
    {"slug": "a6000", "gpus": 1, "max_gpus": 4, "models": ["RTX A6000"]},
    {"slug": "quarter", "gpu_fraction": 0.25},
])


def test_importing_profiles_loads_neither_jupyterhub_nor_tornado_nor_traitlets_config():
    code = ("import sys, gpupool_hub.profiles\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jupyterhub', 'tornado')"
            " or m.startswith('traitlets.config'))\n"
            "assert not bad, bad\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "options, slug, gpus",
    [(None, "cpu", 0), ({}, "cpu", 0), ({"profile": ""}, "cpu", 0), ({"profile": "a6000"}, "a6000", 1),
     ({"profile": "a6000", "gpus": 4}, "a6000", 4), ({"profile": "quarter", "gpus": None}, "quarter", 0)],
)
def test_choose_profile(options, slug, gpus):
    profile, n = choose_profile(PROFILES, options)
    assert (profile.slug, n) == (slug, gpus)


@pytest.mark.parametrize(
    "options, message",
    [
        ([], "user_options must be an object"),
        ({"profile": "x"}, "unknown profile 'x'; choose one of ['cpu', 'a6000', 'quarter']"),
        ({"profile": "a6000", "gpus": 5}, "'gpus' for profile 'a6000' must be 1 to 4, got 5"),
        ({"profile": "quarter", "gpus": 1}, "profile 'quarter' has a fixed GPU amount"),
        ({"profile": "a6000", "gpus": True}, "'gpus' must be a whole number, got True"),
    ],
)
def test_choose_profile_says_what_is_wrong(options, message):
    with pytest.raises(InvalidOptions) as e:
        choose_profile(PROFILES, options)
    assert message in str(e.value)


def test_no_profiles():
    assert choose_profile([], {}) == (None, 0)
    with pytest.raises(InvalidOptions, match="'gpus' needs a profile"):
        choose_profile([], {"gpus": 1})
