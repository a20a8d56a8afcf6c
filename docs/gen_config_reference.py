"""Write docs/configuration.md: every configurable trait of gpupool_hub with its help text.

    .venv/bin/python docs/gen_config_reference.py          # rewrite docs/configuration.md
    .venv/bin/python docs/gen_config_reference.py --check  # exit 1 if the file is out of date

It imports the Configurable classes and lists, for each, the traits it defines
itself (``class_own_traits(config=True)``) and those of gpupool_hub base
classes that have no section of their own (under the first section whose class
has them): name, type, default and help string. Inherited traits (JupyterHub's
Spawner, traitlets' Application) are documented by those projects. Needs the ``kubernetes`` extra (KubeSpawner) to be installed,
since GPUPoolKubeSpawner is part of the reference.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "configuration.md"

# (section title, import path, class name, what reads it, intro)
SECTIONS = [
    ("c.GPUPool", "gpupool_hub.config", "GPUPool",
     "the gpupool service (the spawner's options form asks it for prices and free GPUs)",
     "Prices, credit rules, the pool's nodes, the placement policy and the ledger database."),
    ("c.GPUPoolService", "gpupool_hub.service.app", "GPUPoolService",
     "the gpupool service",
     "The service process: where it listens, its jobs (replenish, debit, reconcile), where usage comes "
     "from, node agent tokens. Most network settings default to what JupyterHub passes to a managed "
     "service in its environment."),
    ("c.Culler", "gpupool_hub.takeback.cull", "Culler",
     "the gpupool service",
     "When and how GPUs are taken back from users whose balance is negative. "
     "See [Culling](admin-guide.md#culling)."),
    ("c.GPUPoolSpawner", "gpupool_hub.spawner", "GPUPoolSpawner",
     "the hub",
     "Settings of the spawner mixin, whichever concrete spawner class you use "
     "(`gpupool-localprocess`, `gpupool-systemd`, `gpupool-kubernetes`, your own). "
     "Plain `c.Spawner` / `c.LocalProcessSpawner` / `c.KubeSpawner` settings keep working."),
    ("c.GPUPoolLocalProcessSpawner", "gpupool_hub.engines.local.spawner", "GPUPoolLocalProcessSpawner",
     "the hub, with `c.JupyterHub.spawner_class = \"gpupool-localprocess\"`",
     "Each server runs as its user's Unix account (the hub runs as root). "
     "See [User isolation](admin-guide.md#user-isolation)."),
    ("c.GPUPoolKubeSpawner", "gpupool_hub.engines.kubernetes.spawner", "GPUPoolKubeSpawner",
     "the hub, with `c.JupyterHub.spawner_class = \"gpupool-kubernetes\"`",
     "How an allocation becomes node affinity and GPU resource limits on the pod."),
    ("c.GPUPoolSystemdSpawner", "gpupool_hub.engines.systemd.spawner", "GPUPoolSystemdSpawner",
     "the hub, with `c.JupyterHub.spawner_class = \"gpupool-systemd\"`",
     "Each server is a systemd unit whose device cgroup allows only its GPUs. "
     "See [GPU access](admin-guide.md#gpu-access-what-holds-and-what-only-asks)."),
    ("c.GPUPoolAgent", "gpupool_hub.agent.app", "GPUPoolAgent",
     "the node agent (`gpupool-agent`, its own config file or command line)",
     "The agent on each GPU node. These go in the agent's file (`--config=/etc/gpupool/agent_config.py`), "
     "not in `jupyterhub_config.py`. See [Node agent](agent.md)."),
]

# Classes whose dynamic defaults depend on nothing but the code.
PURE_DEFAULTS = {"GPUPool", "Culler"}


def _classes():
    import importlib

    out = []
    for title, module, name, reader, intro in SECTIONS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as e:
            raise SystemExit(f"gen_config_reference: cannot import {module}.{name}: {e}\n"
                             "Install the extras: .venv/bin/pip install -e '.[test,kubernetes]'") from None
        out.append((title, cls, reader, intro))
    return out


def _type_name(trait) -> str:
    name = type(trait).__name__
    if name == "Enum":
        return "one of " + ", ".join(f"`{v}`" for v in trait.values)
    return {"Unicode": "str", "Integer": "int", "Float": "float", "Bool": "bool", "Dict": "dict",
            "Int": "int", "List": "list", "Set": "set", "TokenAmount": "token amount"}.get(name, name)


def _default(cls, name: str, trait) -> str:
    if name in getattr(cls, "_trait_default_generators", {}):
        if cls.__name__ in PURE_DEFAULTS:  # defaults that read no environment: ask an instance
            return f"`{getattr(cls(), name)!r}`"
        return "computed at start-up (see below)"
    try:
        value = trait.default_value_repr()
    except Exception:  # pragma: no cover - an odd trait type
        value = repr(trait.default_value)
    if value in ("traitlets.Undefined", "Undefined"):
        return "unset"
    if name.endswith("umask") and isinstance(trait.default_value, int):
        return f"`{trait.default_value:#o}`"  # a mode reads in octal
    if type(trait).__name__ == "TokenAmount" and value not in ("None",):
        value = value.replace("Decimal(", "").rstrip(")").strip("'")
    return f"`{value}`"


def _help(trait) -> str:
    text = inspect.cleandoc(trait.help or "").strip()
    if not text:
        return "(no description)"
    # reStructuredText literals in the help strings become Markdown code.
    text = text.replace("``", "`")
    out: list[str] = []
    in_block = False

    def close_block() -> None:
        while out and not out[-1].strip():
            out.pop()
        out.extend(["```", ""])

    for line in text.splitlines():
        if not in_block and line.rstrip().endswith("::"):
            out.extend([line.rstrip()[:-1], "", "```python"])
            in_block = True
            continue
        if in_block and line and not line.startswith(" "):
            close_block()
            in_block = False
        if in_block:
            if line.strip() or out[-1] != "```python":  # no blank first line in the block
                out.append(line[4:] if line.startswith("    ") else line)
        else:
            out.append(line)
    if in_block:
        close_block()
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def _traits(cls, sections: set[type], documented: set[tuple[type, str]]) -> dict:
    """The class's own traits plus those of its gpupool_hub bases without a section (once)."""
    traits = {}
    for name, trait in cls.class_traits(config=True).items():
        owner = trait.this_class
        mine = owner is cls or (owner not in sections and owner.__module__.startswith("gpupool_hub"))
        if mine and (owner, name) not in documented:
            documented.add((owner, name))
            traits[name] = trait
    return traits


def render() -> str:
    parts = [
        "# Configuration reference",
        "",
        "<!-- Generated by docs/gen_config_reference.py from the help strings in the code. "
        "Do not edit by hand: change the help text in the code and run "
        "`.venv/bin/python docs/gen_config_reference.py`. -->",
        "",
        "Every setting gpupool_hub adds, taken from the code. All of them except "
        "`c.GPUPoolAgent` go in `jupyterhub_config.py`, which the hub and the gpupool "
        "service both read (the service gets the path from `--config` or "
        "`GPUPOOL_CONFIG_FILE`). Values are checked when the file loads; an error names "
        "the trait and the bad value.",
        "",
        "Token amounts (type *token amount*) may be written as int, float, string or "
        "`Decimal`; they are read exactly through their decimal text, so `0.1` is one tenth.",
        "",
        "For how the settings work together, see the [Admin guide](admin-guide.md).",
        "",
    ]
    classes = _classes()
    sections = {cls for _, cls, _, _ in classes}
    documented: set[tuple[type, str]] = set()
    for title, cls, reader, intro in classes:
        traits = _traits(cls, sections, documented)
        parts += [f"## {title}", "", f"Read by {reader}. {intro}", ""]
        parts += ["| trait | type | default |", "|---|---|---|"]
        for name in sorted(traits):
            parts.append(f"| [`{title}.{name}`](#{cls.__name__.lower()}-{name.replace('_', '-')}) | "
                         f"{_type_name(traits[name])} | {_default(cls, name, traits[name])} |")
        parts.append("")
        for name in sorted(traits):
            trait = traits[name]
            parts += [f"### {title}.{name} {{#{cls.__name__.lower()}-{name.replace('_', '-')}}}", "",
                      f"*{_type_name(trait)}*, default {_default(cls, name, trait)}.", "", _help(trait), ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if docs/configuration.md is stale")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run .venv/bin/python docs/gen_config_reference.py",
                  file=sys.stderr)
            return 1
        print(f"{OUTPUT.relative_to(ROOT)} is up to date")
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
