"""MkDocs hooks (``hooks:`` in mkdocs.yml; local code, no plugin, no network).

- Publishes the service's OpenAPI description, ``gpupool_hub/service/openapi.json``,
  as ``openapi.json`` in the built site, so the API reference links the file the
  service itself serves instead of a copy that could go stale.
- Replaces ``<!-- openapi-endpoints -->`` in a page with a table of every
  operation in that file (method, path, summary, parameters, answers).
"""

from __future__ import annotations

import json
from pathlib import Path

from mkdocs.structure.files import File

OPENAPI = Path(__file__).resolve().parent.parent / "gpupool_hub" / "service" / "openapi.json"
MARKER = "<!-- openapi-endpoints -->"
METHODS = ("get", "put", "post", "delete", "patch")


def on_files(files, config):
    files.append(File.generated(config, "openapi.json", abs_src_path=str(OPENAPI)))
    return files


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def endpoint_table() -> str:
    spec = json.loads(OPENAPI.read_text(encoding="utf-8"))
    base = (spec.get("servers") or [{"url": ""}])[0]["url"]
    rows = [f"Paths are relative to `{base}`.", "",
            "| method | path | what | parameters | answers |", "|---|---|---|---|---|"]
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = [p.get("name", "") + (f" ({p['in']})" if p.get("in") not in (None, "path", "query") else "")
                      for p in shared + op.get("parameters", []) if p.get("in") != "path"]
            if "requestBody" in op:
                params.append("JSON body")
            answers = ", ".join(sorted(op.get("responses", {})))
            rows.append(f"| `{method.upper()}` | `{_cell(path)}` | {_cell(op.get('summary', ''))} | "
                        f"{_cell(', '.join(params)) or '—'} | {answers} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, endpoint_table())
    return markdown
