"""Issue 37.5: one rule for names, in request bodies (openapi.json's ``NameCharacters``),
in paths and query arguments, and in the configuration (``gpupool_hub/identity/names.py``).

An admin who configures a team, node, GPU model or profile name holding U+202E (or a
zero-width space) learns it when the configuration loads, not when every spawn of
that team gets a 400.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
from traitlets import TraitError

from gpupool_hub.config import GPUPool
from gpupool_hub.identity.names import name_problem
from gpupool_hub.profiles import parse_profile
from gpupool_hub.service.api.openapi import NAME_PATTERN

RLO = "\u202e"


def test_the_bodies_pattern_and_the_code_refuse_the_same_characters():
    """On every code point, astral ones included (tags, variation selectors supplement)."""
    pattern = re.compile(NAME_PATTERN)
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # lone surrogates: refused for all text, by the JSON reader
        char = chr(code)
        assert (pattern.fullmatch(char) is None) == (name_problem(char) is not None), f"U+{code:04X}"
    for code in (0x200B, 0x200F, 0x202A, 0x202E, 0x2066, 0x2069, 0xFEFF):
        assert name_problem(f"a{chr(code)}b") is not None


#: issue 48.6: the invisible characters the fifth probe found passing the rule
PROBE_FOUND = [0x061C, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064, *range(0x206A, 0x2070), 0x00AD, 0x034F, 0x180E,
               0x115F, 0x3164, 0x2028, 0x2029, 0xE0001, 0xE0041, 0xE007F, 0xFE0F, 0xE0100, 0xE01EF, 0xFFF9]


@pytest.mark.parametrize("code", PROBE_FOUND, ids=lambda c: f"U+{c:04X}")
def test_invisible_characters_are_refused_in_code_and_bodies(code):
    name = f"ad{chr(code)}min"  # reads as "admin"
    assert name_problem(name) is not None and f"U+{code:04X}" in name_problem(name)
    assert re.fullmatch(NAME_PATTERN, name) is None


def test_every_format_character_and_separator_of_this_python_is_refused():
    """The rule's ranges are written out; this keeps them a superset of Unicode's Cf, Zl and Zp
    as the running Python knows them (a newer Unicode version adding one fails here)."""
    missed = [f"U+{c:04X}" for c in range(0x110000)
              if unicodedata.category(chr(c)) in ("Cf", "Zl", "Zp") and name_problem(chr(c)) is None]
    assert missed == []


@pytest.mark.parametrize("name", ["José", "张伟", "nœud-ü", "Zoë O'Brien", "عائشة", "ศรี", "😀"])
def test_names_in_other_scripts_still_pass(name):
    assert name_problem(name) is None and re.fullmatch(NAME_PATTERN, name)


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
