"""The reference JSON schema, as-is and with gelbridge's documented deviations.

``strict(defname)`` validates against /work/shared/spec/lux-ir-v1.json unchanged.
``patched(defname)`` applies exactly the deviations listed in docs/lux-ir.md, so a
test against it checks the documented decision rather than the schema's mistake.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMA_PATH = Path("/work/shared/spec/lux-ir-v1.json")


def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _validator(schema: dict, defname: str) -> Draft202012Validator:
    resource = Resource.from_contents(schema)
    registry = Registry().with_resource(schema["$id"], resource)
    sub = {"$ref": f"{schema['$id']}#/definitions/{defname}"}
    return Draft202012Validator(sub, registry=registry)


def apply_deviations(schema: dict) -> dict:
    s = copy.deepcopy(schema)
    d = s["definitions"]
    # 1. media source is an object {type, data}, not a bare const string
    d["LucentMediaSource"] = {
        "type": "object",
        "properties": {"type": {"type": "string"}, "data": {"type": "string"}},
        "required": ["type", "data"],
    }
    # 2. content also has file and native variants
    d["LucentContent"]["oneOf"].append({
        "type": "object",
        "properties": {"type": {"const": "file"}, "file": {"$ref": "#/definitions/LucentMultimedia"}},
        "required": ["type", "file"],
    })
    d["LucentContent"]["oneOf"].append({
        "type": "object",
        "properties": {"type": {"const": "native"}, "native_tag": {"type": "string"}},
        "required": ["type", "native_tag"],
    })
    # 3. closed enums also allow native strings; effort gains xhigh
    for name in ("LucentRole", "LucentFinishReason", "LucentErrorKind", "LucentAnnotationKind",
                 "LucentModality", "SupportLevel", "LucentReasoningEffort", "LucentReasoningSummary"):
        d[name] = {"type": "string"}
    d["LucentToolChoice"]["oneOf"][0] = {"type": "string"}
    d["LucentStructuredOutput"]["oneOf"][:2] = [{"type": "string", "enum": ["json_object", "text"]}]
    # 4. block types: native tags; block deltas: native and provider_data
    d["LucentBlockType"]["oneOf"][:6] = [{"type": "string"}]
    d["LucentBlockDelta"]["oneOf"].append({
        "type": "object",
        "properties": {"type": {"const": "native"}, "native_tag": {"type": "string"}},
        "required": ["type", "native_tag"],
    })
    d["LucentBlockDelta"]["oneOf"].append({
        "type": "object",
        "properties": {"type": {"const": "provider_data"},
                       "provider_data": {"$ref": "#/definitions/ProviderData"},
                       "redacted": {"type": "boolean"}},
        "required": ["type", "provider_data"],
    })
    # 5. gelbridge's provider_data extension (shape check only; the schema allows it)
    d["ProviderData"] = {
        "type": "object",
        "properties": {"provider": {"type": "string"}, "model": {"type": "string"},
                       "data": {"type": "object"}},
        "required": ["provider", "model", "data"],
    }
    for i in (0, 1, 3):  # text, tool_use, thinking
        d["LucentContent"]["oneOf"][i]["properties"]["provider_data"] = {"$ref": "#/definitions/ProviderData"}
    return s


@cache
def strict(defname: str) -> Draft202012Validator:
    return _validator(load_schema(), defname)


@cache
def patched(defname: str) -> Draft202012Validator:
    return _validator(apply_deviations(load_schema()), defname)


def errors(v: Draft202012Validator, instance: object) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in v.iter_errors(instance)]
