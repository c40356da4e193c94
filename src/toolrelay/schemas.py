"""Reading JSON Schemas: one walker over a schema's every part, the rule that keeps
identity out of a tool's arguments (its reserved properties), and a schema's form for
OpenAI's strict mode.

:func:`nodes` is the only JSON walker of the registry and of typed tools; it never
recurses, so no nesting is too deep to walk.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema_rs

__all__ = ["identity_properties", "nodes", "strict_form"]


def nodes(
    document: Any, *, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[Mapping[str, Any] | list[Any], int]]:
    """Every mapping and list in a JSON document (the document included), each with its
    depth (the document's is 1), depth first. The values of keys in ``skip`` (data, not
    schemas: ``const``, ``enum``) are not entered."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            yield node, depth
            stack.extend((v, depth + 1) for k, v in node.items() if k not in skip)
        elif isinstance(node, list):
            yield node, depth
            stack.extend((v, depth + 1) for v in node)


def _names(value: Any) -> set[str]:
    """The strings of a JSON array (``required``, a ``dependentRequired`` entry)."""
    if isinstance(value, list):
        return {item for item in value if isinstance(item, str)}
    return set()


def _pattern_matches(pattern: Any, reserved: frozenset[str]) -> set[str]:
    """The reserved names ``pattern`` matches, by the validator's own regex engine (so
    ECMA-262 syntax the ``re`` module lacks is read as validation reads it)."""
    if not isinstance(pattern, str):
        return set()
    try:
        validator = jsonschema_rs.Draft202012Validator({"pattern": pattern}, offline=True)
    except (jsonschema_rs.ValidationError, ValueError, TypeError):
        return set()  # not a valid pattern: compiling the schema refuses it anyway
    return {name for name in reserved if validator.is_valid(name)}


_DATA = frozenset({"const", "enum"})


def _named_by(schema: Any, reserved: frozenset[str]) -> set[str]:
    """Reserved names a ``propertyNames`` schema singles out: its ``const``, ``enum`` and
    ``pattern`` keywords (at any depth: ``anyOf`` branches included) that match them."""
    found: set[str] = set()
    for node, _ in nodes(schema, skip=_DATA):
        if isinstance(node, Mapping):
            const = node.get("const")
            if isinstance(const, str) and const in reserved:
                found.add(const)
            found.update(reserved.intersection(_names(node.get("enum"))))
            found.update(_pattern_matches(node.get("pattern"), reserved))
    return found


def identity_properties(schema: Any, reserved: frozenset[str]) -> set[str]:
    """Every reserved name the schema admits as a property, anywhere in it (nested objects,
    ``$defs`` and every other subschema included): named in ``properties``, ``required``,
    ``dependentRequired`` (keys or values), ``dependentSchemas`` or ``dependencies``,
    matched by a ``patternProperties`` regex, or singled out by ``propertyNames``."""
    found: set[str] = set()
    for node, _ in nodes(schema):
        if not isinstance(node, Mapping):
            continue
        props = node.get("properties")
        if isinstance(props, Mapping):  # ``"user_id": false`` forbids it: not admitted
            found.update(n for n in reserved.intersection(props) if props[n] is not False)
        named = node.get("dependentSchemas")
        if isinstance(named, Mapping):
            found.update(reserved.intersection(named))
        found.update(reserved.intersection(_names(node.get("required"))))
        for keyword in ("dependentRequired", "dependencies"):
            named = node.get(keyword)
            if isinstance(named, Mapping):
                found.update(reserved.intersection(named))
                for needed in named.values():
                    found.update(reserved.intersection(_names(needed)))
        patterns = node.get("patternProperties")
        if isinstance(patterns, Mapping):
            for pattern, sub in patterns.items():
                if sub is not False:
                    found.update(_pattern_matches(pattern, reserved))
        if "propertyNames" in node:
            found.update(_named_by(node["propertyNames"], reserved))
    return found


class _NotStrict(Exception):
    pass


_NOT_STRICT = frozenset({"oneOf", "allOf", "not", "if", "patternProperties", "prefixItems",
                         "dependentSchemas", "propertyNames", "unevaluatedProperties"})  # fmt: skip


def strict_form(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` as OpenAI's strict mode wants it — every object closed, every property
    required — when that changes nothing toolrelay accepts: each optional property already
    admits ``null`` (a typed tool's defaulted parameter does: ``null`` means the default).
    ``None`` when it cannot be (an open object, an optional property that refuses ``null``,
    a keyword strict mode lacks)."""
    try:
        return _strict(schema)
    except _NotStrict:
        return None


def _strict(node: Any) -> dict[str, Any]:
    if not isinstance(node, Mapping) or _NOT_STRICT & node.keys():
        raise _NotStrict
    out = dict(node)
    properties = node.get("properties", {})
    if "properties" in node or node.get("type") == "object":
        required = node.get("required", ())
        if node.get("additionalProperties") is not False or any(
            name not in required and not _admits_null(sub) for name, sub in properties.items()
        ):
            raise _NotStrict
        if properties:
            out["properties"] = {name: _strict(sub) for name, sub in properties.items()}
            out["required"] = list(properties)
    if "items" in node:
        out["items"] = _strict(node["items"])
    if "anyOf" in node:
        out["anyOf"] = [_strict(sub) for sub in node["anyOf"]]
    if "$defs" in node:
        out["$defs"] = {name: _strict(sub) for name, sub in node["$defs"].items()}
    return out


def _admits_null(node: Any) -> bool:
    kind = node.get("type") if isinstance(node, Mapping) else None
    return (
        kind == "null"
        or (isinstance(kind, list) and "null" in kind)
        or any(_admits_null(sub) for sub in node.get("anyOf", ()))
    )
