"""An MCP tool's input schema as Ollama takes it. Ollama reads a tool's parameters into a fixed shape
(type, properties, required, items, enum, anyOf, description) and refuses the whole chat request when
a field has the wrong type, so a server's schema is projected onto that shape here: local `$ref`s
inlined, `oneOf` read as `anyOf`, single-element `allOf` merged, keys Ollama would ignore dropped.
What cannot be made sense of is Malformed, and that one tool is left out (never the server). Pure."""

from __future__ import annotations

import re
from typing import Any

# A tool name as the MCP specification allows it; others are left out.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_DEPTH = 24  # nesting past this (or a $ref cycle) is not a schema a model can fill in
DESCRIPTION_MAX_CHARS = 4_000  # a tool's description beyond this is prompt spent on every call
_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})


class Malformed(ValueError):
    """A schema (or tool) Ollama could not take; the message says what is wrong."""


def check_tool_name(name: Any) -> str:
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise Malformed(f"the tool name {name!r} is not 1-128 of A-Z, a-z, 0-9, '_', '-', '.'")
    return name


def description_of(description: Any, title: Any = None) -> str:
    text = description if isinstance(description, str) and description.strip() else title
    text = text.strip() if isinstance(text, str) else ""
    return text if len(text) <= DESCRIPTION_MAX_CHARS else text[:DESCRIPTION_MAX_CHARS] + "…"


def parameters(schema: Any) -> dict[str, Any]:
    """The tool's `parameters` for Ollama, from its MCP `inputSchema`."""
    if not isinstance(schema, dict):
        raise Malformed("the input schema is not an object")
    defs = {**_mapping(schema.get("definitions")), **_mapping(schema.get("$defs"))}
    resolved = _resolve(schema, defs, 0)
    kind = resolved.get("type", "object")
    if kind != "object":
        raise Malformed(f"the input schema's type is {kind!r}; a tool takes an object")
    out: dict[str, Any] = {"type": "object", "properties": _properties(resolved.get("properties"), defs, 1)}
    required = _required(resolved.get("required"))
    if required:
        out["required"] = required
    return out


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _resolve(node: Any, defs: dict[str, Any], depth: int) -> dict[str, Any]:
    """`node` with a local $ref and a one-element allOf folded in (its own keys win)."""
    if depth > MAX_DEPTH:
        raise Malformed(f"nested more than {MAX_DEPTH} levels deep (or a $ref refers to itself)")
    if node is True or node == {}:
        return {}
    if not isinstance(node, dict):
        raise Malformed(f"a schema is {type(node).__name__}, not an object")
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str) or not re.fullmatch(r"#/(\$defs|definitions)/[^/]+", ref):
            raise Malformed(f"$ref {ref!r} does not point into the schema's own $defs")
        target = defs.get(ref.rsplit("/", 1)[1])
        if target is None:
            raise Malformed(f"$ref {ref!r} names no definition")
        node = {**_resolve(target, defs, depth + 1), **{k: v for k, v in node.items() if k != "$ref"}}
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1:
        node = {**_resolve(all_of[0], defs, depth + 1), **{k: v for k, v in node.items() if k != "allOf"}}
    return node


def _property(node: Any, defs: dict[str, Any], depth: int) -> dict[str, Any]:
    node = _resolve(node, defs, depth)
    out: dict[str, Any] = {}
    kind = node.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) and k in _TYPES for k in kinds):
            raise Malformed(f"type {kind!r} is not a JSON Schema type")
        out["type"] = kind
    description = node.get("description")
    if isinstance(description, str) and description:
        out["description"] = description
    if "enum" in node:
        if not isinstance(node["enum"], list):
            raise Malformed("enum is not a list")
        out["enum"] = node["enum"]
    elif "const" in node:
        out["enum"] = [node["const"]]
    alternatives = node.get("anyOf", node.get("oneOf"))
    if alternatives is not None:
        if not isinstance(alternatives, list) or not alternatives:
            raise Malformed("anyOf/oneOf is not a non-empty list")
        out["anyOf"] = [_property(a, defs, depth + 1) for a in alternatives]
    items = node.get("items")
    if isinstance(items, dict | bool):
        out["items"] = _property(items, defs, depth + 1)
    elif items is not None and not isinstance(items, list):  # (a list: tuple items, which Ollama shows no one)
        raise Malformed("items is neither a schema nor a list of schemas")
    if "properties" in node:
        out["properties"] = _properties(node["properties"], defs, depth + 1)
    return out


def _properties(raw: Any, defs: dict[str, Any], depth: int) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise Malformed("properties is not an object")
    return {name: _property(value, defs, depth + 1) for name, value in raw.items()}


def _required(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
        raise Malformed("required is not a list of property names")
    return list(raw)
