"""Issue 37.5: one rule for names, in request bodies (openapi.json's ``NameCharacters``),
in paths and query arguments, and in the configuration (``gpupool_hub/names.py``).

An admin who configures a team, node, GPU model or profile name holding U+202E (or a
zero-width space) learns it when the configuration loads, not when every spawn of
that team gets a 400.
"""

from __future__ import annotations

import re

import pytest
from traitlets import TraitError

from gpupool_hub.config import GPUPool
from gpupool_hub.names import name_problem
from gpupool_hub.profiles import parse_profile
from gpupool_hub.service.api.schema import NAME_PATTERN

RLO = "\u202e"


def test_the_bodies_pattern_and_the_code_refuse_the_same_characters():
    pattern = re.compile(NAME_PATTERN)
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # lone surrogates: refused for all text, by the JSON reader
        char = chr(code)
        assert (pattern.fullmatch(char) is None) == (name_problem(char) is not None), f"U+{code:04X}"
    for code in (0x200B, 0x200F, 0x202A, 0x202E, 0x2066, 0x2069, 0xFEFF):
        assert name_problem(f"a{chr(code)}b") is not None


@pytest.mark.parametrize("settings, where", [
    ({"nodes": [{"name": f"node{RLO}a", "cpu_milli": 1000, "memory_mib": 1024}]}, "c.GPUPool.nodes[0].name"),
    ({"nodes": [{"name": "node-a", "cpu_milli": 1000, "memory_mib": 1024,
                 "gpus": [{"model": f"A1\u200b00"}]}]}, "c.GPUPool.nodes[0].gpus"),
    ({"teams": {f"vi{RLO}sion": {"gpus": 2}}}, "c.GPUPool.teams"),
    ({"default_team": f"every\u2066one"}, "c.GPUPool.default_team"),
    ({"group_credits": {f"\ufeffstaff": {"daily": 5}}}, "c.GPUPool.group_credits"),
], ids=["node", "GPU model", "team", "default team", "group"])
def test_the_configuration_refuses_such_names_when_it_loads(settings, where):
    with pytest.raises(TraitError, match=re.escape(where)) as e:
        GPUPool(**settings)
    assert "bidirectional or zero-width controls" in str(e.value)


@pytest.mark.parametrize("raw", [
    {"slug": "small", "display_name": f"GPU {RLO}small"},
    {"slug": "a100", "gpus": 1, "models": [f"A100\u200d"]},
], ids=["display name", "model"])
def test_a_profile_with_such_a_name_is_refused(raw):
    with pytest.raises(TraitError, match="bidirectional or zero-width controls"):
        parse_profile(raw, 0)


def test_ordinary_names_load():
    GPUPool(nodes=[{"name": "nœud-ü", "cpu_milli": 1000, "memory_mib": 1024}], teams={"视觉": {"gpus": 1}})
    assert parse_profile({"slug": "s", "display_name": "Petit GPU (½)"}, 0).display_name == "Petit GPU (½)"
