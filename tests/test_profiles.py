"""gpupool_hub.profiles on its own: no JupyterHub needed, and user options checked as plain values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from traitlets import TraitError

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


# ------------------------------------------------ guarantee classes (issue 23 item 4)


def test_each_share_has_a_class_in_words():
    mig, mps, ts, whole = parse_profiles([
        {"slug": "m", "mig": "1g.10gb"}, {"slug": "p", "gpu_fraction": 0.75, "share": "mps"},
        {"slug": "t", "gpu_fraction": 0.25}, {"slug": "w", "gpus": 1}])
    assert [(p.share_class, p.class_words) for p in (mig, mps, ts, whole)] == [
        ("mig", "isolated"), ("mps", "memory capped"), ("timeslice", "shared, best effort"), ("", "")]
    assert mps.request() == {"gpu_fraction": "0.75", "share": "mps"}


@pytest.mark.parametrize("profiles, refused", [
    # two servers of one 0.5 mps profile fit one GPU: two Unix users on one MPS GPU
    ([{"slug": "half", "gpu_fraction": 0.5, "share": "mps"}], "two 'half' servers fit on one GPU together"),
    ([{"slug": "big", "gpu_fraction": 0.7, "share": "mps"}, {"slug": "small", "gpu_fraction": 0.3, "share": "mps"}],
     "a 'big' and a 'small' server fit on one GPU together (0.7 + 0.3 <= 1)"),
    ([{"slug": "big", "gpu_fraction": 0.7, "share": "mps"},
      {"slug": "small", "gpu_fraction": 0.3, "share": "mps", "models": ["A100"]}], "fit on one GPU together"),
    # over half a GPU each: one mps share per GPU; timeslice shares of others may fill the rest
    ([{"slug": "big", "gpu_fraction": 0.6, "share": "mps"}, {"slug": "t", "gpu_fraction": 0.4}], None),
    # mps shares that never meet on one GPU model
    ([{"slug": "a", "gpu_fraction": 0.5, "share": "mps", "models": ["A100"]},
      {"slug": "b", "gpu_fraction": 0.6, "share": "mps", "models": ["H100"]}],
     "two 'a' servers fit on one GPU together"),
    ([{"slug": "a", "gpu_fraction": 0.6, "share": "mps", "models": ["A100"]},
      {"slug": "b", "gpu_fraction": 0.7, "share": "mps", "models": ["H100"]}], None),
])
def test_mps_profiles_that_could_put_two_unix_users_on_one_gpu_are_refused_at_load(profiles, refused):
    if refused is None:
        parse_profiles(profiles)
        return
    with pytest.raises(TraitError) as e:
        parse_profiles(profiles)
    assert refused in str(e.value) and "MPS serves one Unix user per GPU at a time" in str(e.value)


@pytest.mark.parametrize("raw, message", [
    ({"slug": "x", "gpus": 1, "share": "mps"}, "this profile has none"),
    ({"slug": "x", "gpu_fraction": 0.6, "share": "exclusive"}, "'share' must be 'timeslice' or 'mps'"),
    ({"slug": "x", "gpu_fraction": 0.6, "share": "mig"}, "'share' must be 'timeslice' or 'mps'"),
])
def test_a_bad_share_names_the_key(raw, message):
    with pytest.raises(TraitError, match=re.escape(message)):
        parse_profiles([raw])


def test_the_spawner_refuses_an_mps_config_that_cannot_hold_when_it_loads():
    from gpupool_hub.engines.local.spawner import GPUPoolSimpleSpawner

    with pytest.raises(TraitError, match="MPS serves one Unix user per GPU"):
        GPUPoolSimpleSpawner(profiles=[{"slug": "q", "gpu_fraction": 0.25, "share": "mps"}])
