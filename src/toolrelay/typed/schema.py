"""pydantic's JSON Schema made for a model to read: ``$defs`` inlined (the recursive ones
kept), ``title``s dropped, objects closed."""

from __future__ import annotations

from typing import Any

from ..schemas import nodes

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "if", "then", "else",
                         "contains", "propertyNames", "unevaluatedItems",
                         "unevaluatedProperties"})  # fmt: skip
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_DEF = "#/$defs/"


def _refs(schema: Any) -> set[str]:
    """The ``$defs`` entries the schema refers to."""
    refs = (node.get("$ref") for node, _ in nodes(schema) if isinstance(node, dict))
    return {ref[len(_DEF) :] for ref in refs if isinstance(ref, str) and ref.startswith(_DEF)}


def _recursive(defs: dict[str, Any]) -> set[str]:
    """The definitions that reach themselves through ``$ref``s (they must stay ``$defs``)."""
    edges = {name: _refs(body) for name, body in defs.items()}
    cyclic: set[str] = set()
    for start in defs:
        seen: set[str] = set()
        stack = list(edges[start])
        while stack:
            name = stack.pop()
            if name == start:
                cyclic.add(start)
                break
            if name not in seen and name in edges:
                seen.add(name)
                stack.extend(edges[name])
    return cyclic


def tidy(schema: dict[str, Any], *, close_objects: bool) -> dict[str, Any]:
    """pydantic's schema made for a model to read: ``$defs`` inlined (the recursive ones
    kept), ``title``s dropped, and, with ``close_objects``, every object with
    ``properties`` and no ``additionalProperties`` closed (``false``) — pydantic ignores
    unknown fields of a nested model; the model is told of them instead."""
    defs: dict[str, Any] = schema.get("$defs", {})
    kept = _recursive(defs)

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEF) and ref[len(_DEF) :] not in kept:
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return {**walk(defs[ref[len(_DEF) :]]), **walk(siblings)}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" or key == "$defs":
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: walk(sub) for name, sub in value.items()}
            elif key in _SCHEMA_ONE:
                out[key] = walk(value)
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [walk(sub) for sub in value]
            else:
                out[key] = value
        if close_objects and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out

    result: dict[str, Any] = walk(schema)
    if kept:
        result["$defs"] = {name: walk(defs[name]) for name in sorted(kept)}
    return result
