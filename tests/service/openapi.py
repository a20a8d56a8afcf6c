"""Check API answers against the service's own OpenAPI document."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema

SPEC = json.loads(resources.files("gpupool_hub.service").joinpath("openapi.json").read_text())


def check(schema_name: str, instance: Any) -> None:
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": SPEC["components"]}
    jsonschema.validate(instance, schema)


def documented_status(path: str, method: str, status: int) -> bool:
    return str(status) in SPEC["paths"][path][method.lower()]["responses"]
